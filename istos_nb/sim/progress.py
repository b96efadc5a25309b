"""A progress bar for long simulation runs in a notebook (ipywidgets), silent elsewhere.

The bar only appears once a run has taken ``show_after_s`` of wall time, so short runs (the
common case while exploring) leave no clutter in the cell's output.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any


def in_notebook() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    ip = shell.get_ipython()  # type: ignore[attr-defined]
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


def auto_progress(show_after_s: float = 1.0) -> Callable[[float, float], None] | None:
    """A ``progress(t, until)`` callback drawing an IntProgress bar, or None outside Jupyter."""
    if not in_notebook():
        return None
    started = time.perf_counter()
    bar: dict[str, Any] = {}

    def update(t: float, until: float) -> None:
        if "w" not in bar:
            if time.perf_counter() - started < show_after_s:
                return
            import ipywidgets
            from IPython.display import display

            bar["w"] = ipywidgets.FloatProgress(min=0.0, max=until,
                                                description="virtual time")
            display(bar["w"])
        bar["w"].value = min(t, until)
        bar["w"].description = f"t={t:,.0f} s"

    return update
