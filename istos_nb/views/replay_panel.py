"""The LiveDashboard's "replay" tab: take the last N minutes of a live queue and run what-ifs.

The trace comes from the owner's event ring (the follow window while following), with the
queue's policy from ``stats``: no new request type, and nothing waits for minutes to record.
"Replay" runs the same jobs on the simulator with the lease, heartbeat and fleet set in the tab,
next to a replay under the recorded policy, and shows :func:`~istos_nb.views.compare.compare`'s
table, the overlaid depth chart and the lease Gantt of the recording against the what-if
(:func:`~istos_nb.views.replay_charts.replay_gantt`). A replay blocks the clicking thread for a
few seconds (a simulated hour of a few thousand jobs); errors show in the tab's status line.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as W

from ..data.trace import Trace
from ..sim.replay import replay
from .compare import compare, compare_chart
from .panels import figure_png
from .replay_charts import replay_gantt

__all__ = ["ReplayPanel", "recent_trace"]

RING_EVENTS = 10_000


def recent_trace(live_queue: Any, minutes: float) -> Trace:
    """The last ``minutes`` of ``live_queue``'s events (as far as its ring reaches) as a Trace."""
    policy = live_queue.stats().get("policy") or {}
    events = live_queue.raw_events(RING_EVENTS)
    if events:
        newest = max(float(e["t"]) for e in events)
        events = [e for e in events if float(e["t"]) >= newest - 60.0 * minutes]
    return Trace.from_events(events, queue=live_queue.queue, policy=policy, source="ring")


class ReplayPanel:
    """Widgets: minutes, lease, heartbeat, workers, concurrency, a Replay button, the result."""

    def __init__(self, live_queue: Any) -> None:
        self.live_queue = live_queue
        self.minutes = W.BoundedFloatText(value=10, min=0.1, max=24 * 60, description="minutes")
        self.lease = W.BoundedFloatText(value=0, min=0, max=86400,
                                        description="lease s", tooltip="0: as recorded")
        self.heartbeat = W.Checkbox(value=False, description="heartbeat")
        self.workers = W.BoundedIntText(value=0, min=0, max=256, description="workers",
                                        tooltip="0: the recorded fleet")
        self.concurrency = W.BoundedIntText(value=0, min=0, max=1024,
                                            description="concurrency", tooltip="0: as recorded")
        self.button = W.Button(description="Replay", icon="play")
        self.status = W.HTML()
        self.table = W.HTML()
        self.chart = W.Image(format="png", layout=W.Layout(display="none", width="100%",
                                                           height="auto"))
        self.gantt = W.Image(format="png", layout=W.Layout(display="none", width="100%",
                                                           height="auto"))
        for widget, cls in ((self.button, "istos-replay-run"), (self.status, "istos-replay-status"),
                            (self.table, "istos-replay-table"), (self.chart, "istos-replay-chart"),
                            (self.gantt, "istos-replay-gantt")):
            widget.add_class(cls)
        self.button.on_click(lambda _b: self.run())
        self.widget = W.VBox([W.HBox([self.minutes, self.lease, self.heartbeat]),
                              W.HBox([self.workers, self.concurrency, self.button]),
                              self.status, self.table, self.chart, self.gantt])

    def what_if(self) -> dict[str, Any]:
        """The replay options the widgets ask for (unset ones left to the recording)."""
        options: dict[str, Any] = {}
        if self.lease.value > 0:
            options["lease_s"] = float(self.lease.value)
        if self.heartbeat.value:
            options["heartbeat"] = True
        if self.workers.value > 0:
            options["workers"] = int(self.workers.value)
        if self.concurrency.value > 0:
            options["concurrency"] = int(self.concurrency.value)
        return options

    def run(self) -> None:
        """Take the recent trace, replay it as recorded and as asked, show both side by side."""
        self.status.value = "replaying…"
        try:
            trace = recent_trace(self.live_queue, float(self.minutes.value))
            same = replay(trace)
            asked = replay(trace, **self.what_if())
            table = compare(trace, same, asked, names=["recorded", "replayed", "what-if"])
            self.table.value = table.to_html(border=0, float_format=lambda x: f"{x:.3f}")
            self.chart.value = figure_png(compare_chart(
                trace, same, asked, names=["recorded", "replayed", "what-if"]))
            self.chart.layout.display = ""
            self.gantt.value = figure_png(replay_gantt(
                trace, asked, title="Leases: recorded (grey) vs what-if (coloured)"))
            self.gantt.layout.display = ""
            self.status.value = html.escape(trace.summary())
        except Exception as exc:  # the tab reports; the dashboard keeps running
            self.status.value = html.escape(f"error: {type(exc).__name__}: {exc}")
