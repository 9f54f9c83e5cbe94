"""``python -m gateway.bench.soak``: see :mod:`gateway.bench.soak`."""

import sys

from gateway.bench.soak.cli import main

sys.exit(main())
