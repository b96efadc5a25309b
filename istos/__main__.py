"""``python -m istos``: the operator's command line (see :mod:`istos.ops.cli`)."""

from __future__ import annotations

import sys

from .ops.cli import main

if __name__ == "__main__":  # importing the module (tools that walk packages) runs nothing
    sys.exit(main())
