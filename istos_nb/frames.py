"""The public ``istos_nb.frames`` module: JobEvent streams as pandas DataFrames.

Notebooks and the README import this name; the code lives in :mod:`istos_nb.views.frames`.
"""

from __future__ import annotations

from .views import frames as _implementation
from .views.frames import *  # noqa: F403  (the implementation's __all__, nothing else)

__all__ = _implementation.__all__
