"""``python -m istos``: the operator's command line (see :mod:`istos.cli`)."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
