"""The public ``istos_nb.tables`` module: display helpers for the tables the notebook side returns.

Notebooks and the README import this name; the code lives in :mod:`istos_nb.views.tables`
(one module at two layers: this public name, and its implementation).
"""

from __future__ import annotations

from .views import tables as _implementation
from .views.tables import *  # noqa: F403  (the implementation's __all__, nothing else)

__all__ = _implementation.__all__
