"""The public ``istos_nb.frames`` module: JobEvent streams as pandas DataFrames.

Notebooks and the README import this name; the code lives in :mod:`istos_nb.data.frames`
(one module at two layers: this public name, and its implementation).
"""

from __future__ import annotations

from .data import frames as _implementation
from .data.frames import *  # noqa: F403  (the implementation's __all__, nothing else)

__all__ = _implementation.__all__
