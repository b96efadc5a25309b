"""The public ``istos_nb.charts`` module: matplotlib figures of the frames.

Notebooks and the README import this name; the code lives in :mod:`istos_nb.views.charts`
(one module at two layers: this public name, and its implementation).
"""

from __future__ import annotations

from .views import charts as _implementation
from .views.charts import *  # noqa: F403  (the implementation's __all__, nothing else)

__all__ = _implementation.__all__
