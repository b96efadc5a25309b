"""The public ``istos_nb.attach`` module: attach to a live queue, inspect it, follow it.

Notebooks and the README import this name; the code lives in :mod:`istos_nb.live.attach`
(one module at two layers: this public name, and its implementation).
"""

from __future__ import annotations

from .live import attach as _implementation
from .live.attach import *  # noqa: F403  (the implementation's __all__, nothing else)

__all__ = _implementation.__all__
