"""The record generator's parts; run it with ``python -m protocols.generate``."""
