"""The public ``istos_nb.widgets`` module: the simulator playground and the live queue monitor.

Notebooks and the README import this name; the code lives in :mod:`istos_nb.views.widgets`.
"""

from __future__ import annotations

from .views.widgets import (
    DEFAULT_PARAMS,
    LiveDashboard,
    SimDashboard,
    scenario_from_params,
)

__all__ = [
    "DEFAULT_PARAMS", "LiveDashboard", "SimDashboard", "scenario_from_params",
]
