"""The public ``istos_nb.tables`` module: display helpers for the tables the notebook side returns.

Notebooks and the README import this name; the code lives in :mod:`istos_nb.views.tables`.
"""

from __future__ import annotations

from .views.tables import (
    TIME_COLUMNS,
    times_of_day,
)

__all__ = [
    "TIME_COLUMNS", "times_of_day",
]
