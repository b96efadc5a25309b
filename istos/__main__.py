"""``python -m istos``: the operator's command line (see :mod:`istos.cli`)."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":  # importing the module (tools that walk packages) runs nothing
    sys.exit(main())
