"""The ``figtank`` command: ``serve``, the client subcommands, ``bench``."""
