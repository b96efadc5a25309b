"""The public ``istos_nb.widgets`` module: the simulator playground and the live queue monitor.

Notebooks and the README import this name; the code lives in :mod:`istos_nb.views.widgets`
(one module at two layers: this public name, and its implementation).
"""

from __future__ import annotations

from .views import widgets as _implementation
from .views.widgets import *  # noqa: F403  (the implementation's __all__, nothing else)

__all__ = _implementation.__all__
