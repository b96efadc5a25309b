"""The notebook side of Istos: attach to a live queue, the simulator, frames, charts, widgets.

``import istos_nb`` stays cheap: the names below are imported on first use (PEP 562 module
``__getattr__``), so a script that only needs the simulator never loads Zenoh sessions or
pandas through this package.

``istos_nb.attach`` is the *function* :func:`istos_nb.attach.attach`, also after its submodule
was imported directly (``from istos_nb.attach import LiveQueue``): the import system would
otherwise rebind the package attribute to the submodule, and ``from istos_nb import attach``
would then return a module depending on import order. The submodule itself stays reachable as
``sys.modules["istos_nb.attach"]`` (and ``from istos_nb.attach import ...`` is unaffected).
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .live.attach import LiveQueue, aattach, attach
    from .live.overview import aqueues, queues
    from .views.compare import compare, compare_chart, predict
    from .views.widgets import LiveDashboard, SimDashboard

__all__ = ["attach", "aattach", "LiveQueue", "LiveDashboard", "SimDashboard", "queues",
           "aqueues", "compare", "compare_chart", "predict"]

# public name -> the submodule defining it
_LAZY = {"attach": "istos_nb.attach", "aattach": "istos_nb.attach",
         "LiveQueue": "istos_nb.attach", "LiveDashboard": "istos_nb.widgets",
         "SimDashboard": "istos_nb.widgets", "queues": "istos_nb.live.overview",
         "aqueues": "istos_nb.live.overview", "compare": "istos_nb.views.compare",
         "compare_chart": "istos_nb.views.compare", "predict": "istos_nb.views.compare"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache: later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """Keeps a public function from being shadowed by its same-named submodule (see above)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if (isinstance(value, types.ModuleType) and _LAZY.get(name) == value.__name__
                and hasattr(value, name)):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
