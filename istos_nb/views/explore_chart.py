"""A counterexample's picture: its run's lease Gantt with the faults shaded and the moment the
property broke marked.

Drawn on :func:`istos_nb.views.charts.lease_gantt` over the run's whole span (virtual seconds
from 0), so crashes and restarts carry the Gantt's own markers; each fault of the schedule adds
a shaded span (gid ``"fault"``) labelled with its kind and node, and the violating moment a red
vertical line (gid ``"violation"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from istos_nb.views.charts import lease_gantt

__all__ = ["counterexample_chart"]


class Counterexample(Protocol):
    """What the chart reads of ``istos_nb.sim.counterexample.Counterexample`` (named here,
    not imported: the simulator calls this module, so an import back would be a circle)."""

    @property
    def prop(self) -> Any: ...
    @property
    def result(self) -> Any: ...
    @property
    def until(self) -> float: ...
    @property
    def schedule(self) -> Sequence[Any]: ...
    @property
    def moment(self) -> float | None: ...

FAULT_SHADE = "#7f7f7f"
VIOLATION_COLOR = "#d62728"


def counterexample_chart(ce: Counterexample, ax: Axes | None = None) -> Figure:
    """The lease Gantt of ``ce.result`` from 0 to ``ce.until``, faults and violation marked.
    ``ax``: draw into an existing Axes. Never raises for an empty run (the Gantt says so)."""
    title = f"Counterexample: {ce.prop.name}"
    fig = lease_gantt(ce.result.job_events(), ax=ax, title=title, window=(0.0, ce.until))
    axes = ax if ax is not None else fig.axes[0]
    top = axes.get_ylim()[1]
    for fault in ce.schedule:
        end = fault.end if fault.end > fault.at else fault.at + ce.until / 200
        axes.axvspan(fault.at, end, color=FAULT_SHADE, alpha=0.18, gid="fault", zorder=0.5)
        label = fault.kind.replace("_", " ") + (f" {fault.node}" if fault.node else "")
        axes.text(fault.at, top, label, fontsize=8, va="bottom", ha="left", gid="fault_label")
    moment = ce.moment
    if moment is not None:
        axes.axvline(moment, color=VIOLATION_COLOR, linewidth=1.5, gid="violation", zorder=3)
    return fig
