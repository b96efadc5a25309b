"""The marks a lease Gantt draws over its bars: redelivery arcs, node crash and restart markers,
and deliveries that died mid-job. Private to :mod:`istos_nb.views.charts`."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from istos import events as ev
from istos_nb.data.frames import node_events_frame, worker_node
from istos_nb.views.glyphs import Drawn

__all__ = ["ARC_BULGE", "delivery_deaths", "node_markers", "redeliveries"]

ARC_POINTS = 16
ARC_BULGE = 0.012  # of the time axis per lane crossed: arcs of different length never stack
DELIVERY_CRASHED = "delivery_crashed"  # the simulator's node event for a mid-job death


def _arc(x0: float, y0: float, x1: float, y1: float, bulge: float) -> list[tuple[float, float]]:
    """A quadratic curve from (x0, y0) to (x1, y1) bowed forward in time by ``bulge`` per lane
    crossed. Straight segments of leases that expired together stacked into one vertical line;
    arcs of different lane distance nest instead, each one visible."""
    cx, cy = max(x0, x1) + bulge * abs(y1 - y0), (y0 + y1) / 2
    s = np.linspace(0.0, 1.0, ARC_POINTS)
    xs = (1 - s) ** 2 * x0 + 2 * (1 - s) * s * cx + s ** 2 * x1
    ys = (1 - s) ** 2 * y0 + 2 * (1 - s) * s * cy + s ** 2 * y1
    return list(zip(xs.tolist(), ys.tolist(), strict=True))


def redeliveries(leases: pd.DataFrame, lane_of: np.ndarray, start: np.ndarray,
                  end: np.ndarray, bulge: float) -> list[list[tuple[float, float]]]:
    """One arc per expired lease: from its end on its lane to the next claim of the job."""
    segments = []
    next_of: dict[str, int] = {}
    jobs, outcomes = leases["job_id"].tolist(), leases["outcome"].tolist()
    for i in range(len(jobs) - 1, -1, -1):  # backwards: the next claim is already known
        if outcomes[i] == "expired" and jobs[i] in next_of:
            j = next_of[jobs[i]]
            segments.append(_arc(end[i], lane_of[i], start[j], lane_of[j], bulge))
        next_of[jobs[i]] = i
    return segments[::-1]


def node_markers(ax: Axes, df: pd.DataFrame, lane: dict[str, int], t0: float,
                  drawn: Drawn) -> None:
    """Crash and restart markers on every lane of that node (gids ``crash``/``restart``)."""
    nodes = node_events_frame(df)
    for kind, key, gid in ((ev.CRASHED, "crashed", "crash"),
                           (ev.RESTARTED, "restarted", "restart")):
        points = [(t - t0, i) for t, node, k in nodes.itertuples(index=False) if k == kind
                  for w, i in lane.items() if worker_node(w) == node]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.scatter(xs, ys, zorder=3, gid=gid, **drawn.add(key).scatter_style())


def delivery_deaths(ax: Axes, df: pd.DataFrame, leases: pd.DataFrame, y: np.ndarray,
                     t0: float, drawn: Drawn) -> None:
    """A marker (gid ``delivery_crashed``) where a delivery died mid-job while its node stayed
    up: without it, the red bar that follows (the lease running out) has nothing to explain it."""
    deaths = df[df["kind"] == DELIVERY_CRASHED]
    points = []
    for t, node, job in zip(deaths["t"], deaths["node"], deaths["job_id"], strict=True):
        held = leases[(leases["job_id"] == job) & (leases["start"] <= t + 1e-9)]
        held = held[[worker_node(w) == node for w in held["worker"]]]
        if not held.empty:
            points.append((t - t0, y[held.index[-1]]))
    if points:
        xs, ys = zip(*points, strict=True)
        ax.scatter(xs, ys, zorder=3.2, gid="delivery_crashed",
                   **drawn.add("delivery_crashed").scatter_style())
