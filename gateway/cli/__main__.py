"""``python -m gateway.cli`` runs the ``figtank`` command."""

import sys

from gateway.cli.main import main

sys.exit(main())
