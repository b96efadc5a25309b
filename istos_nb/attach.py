"""The public ``istos_nb.attach`` module: attach to a live queue, inspect it, follow it.

Notebooks and the README import this name; the code lives in :mod:`istos_nb.live.attach`.
"""

from __future__ import annotations

from .live.attach import (
    LiveQueue,
    aattach,
    attach,
)

__all__ = [
    "attach", "aattach", "LiveQueue",
]
