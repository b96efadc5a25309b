"""Overlay charts of a recording and its replay: the lease Gantt and the queue depth of both runs
on one time axis, so a reader sees where the replay follows the recording and where it parts.

Each run's time is seconds from its own first arrival (a live recording runs on the owner's wall
clock, a replay on virtual time starting at ``LEAD_S``): the same job arrives at the same x in
both. So these charts keep relative seconds also for a live recording (no wall-clock axis).
Both take each run as a :class:`~istos_nb.data.trace.Trace`, a
:class:`~istos_nb.sim.result.SimResult`, or events in any form ``events_frame`` accepts, and
follow the chart contract of :mod:`istos_nb.views.charts` (which re-exports them).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from istos.errors import ConfigError

from ..data.frames import EventsLike, depth_frame, leases_frame, worker_node
from ..data.trace import Trace
from ..sim.result import SimResult
from .chartkit import (
    OUTCOME_COLORS,
    axes_for,
    bars,
    done,
    label,
    lanes,
    legend,
    no_events,
    short_ids,
    step_bins,
)
from .glyphs import Drawn

__all__ = ["replay_depth", "replay_gantt"]

RunLike = Trace | SimResult | EventsLike
AXIS_LABEL = "seconds from the first arrival"
_MAX_STEPS = 400  # a longer depth series is drawn as its mean per bin (as depth_chart does)
_BINS = 200


def as_trace(run: RunLike, queue: str | None = None) -> Trace:
    """A run as a Trace (a SimResult's or an event stream's events, one queue)."""
    if isinstance(run, Trace):
        return run
    if isinstance(run, SimResult):
        return Trace.from_events(run.job_events(), queue=queue, source="simulation")
    return Trace.from_events(run, queue=queue)


def _slot(worker: Any) -> str:
    """A lane per slot, named ``node #i``: a replay's handler has another function name than
    the recorded one, its slots are the same."""
    text = str(worker) if isinstance(worker, str) else "(unknown)"
    node = worker_node(text) or text
    _fn, sep, index = text.rpartition("#")
    return f"{node} #{index}" if sep else node


def _leases(trace: Trace) -> pd.DataFrame:
    """The run's deliveries of its jobs, with start/end in seconds from its first arrival and
    open ones run to its last event."""
    df = leases_frame(trace.frame)
    df = df[df["job_id"].isin(set(trace.jobs["job_id"]))].copy()
    df["start"] = df["start"] - trace.t0
    df["end"] = df["end"].fillna(trace.t0 + trace.span_s) - trace.t0
    return df


def replay_gantt(recorded: RunLike, replayed: RunLike, by: Literal["slot", "job"] = "slot",
                 max_jobs: int = 30, window: tuple[float, float] | None = None,
                 ax: Axes | None = None, title: str | None = None) -> Figure:
    """The recorded leases (tall grey bars, gid ``"recorded_leases"``) and the replayed ones
    (narrower bars coloured by outcome, gid ``"leases"``), one lane per worker slot (``by=
    "slot"``: ``node #i``) or per job (``by="job"``: the ``max_jobs`` jobs delivered most often
    in either run, the legend says how many of how many), on one axis of seconds from each
    run's first arrival; ``window=(start, end)`` shows only those seconds (the leases that
    overlap them). Each collection holds one rectangle path per delivery in claim order; bars
    too short to see are widened to 2 px. A crash of the recording draws the ``"crash"`` marker
    (and its return the ``"restart"`` one) on its node's lanes. Where the replay follows the
    recording each coloured bar sits inside its grey one.
    """
    if by not in ("slot", "job"):
        raise ConfigError(f"replay_gantt: by must be 'slot' or 'job', got {by!r}")
    if window is not None and not (len(window) == 2 and float(window[0]) < float(window[1])):
        raise ConfigError(f"replay_gantt: window must be (start, end) with start < end, "
                         f"got {window!r}")
    rec = as_trace(recorded)
    rep = as_trace(replayed, rec.queue or None)
    fig, ax, owned = axes_for(ax, (10, 4))
    label(ax, title or "Leases: recorded (grey) vs replayed (coloured)", AXIS_LABEL,
          "worker slot" if by == "slot" else "job")
    old, new = _leases(rec), _leases(rep)
    if window is not None:
        lo, hi = float(window[0]), float(window[1])
        old = old[(old["end"] >= lo) & (old["start"] <= hi)]
        new = new[(new["end"] >= lo) & (new["start"] <= hi)]
    if old.empty and new.empty:
        no_events(ax)
        return done(fig, ax, owned)
    names, old, new, note = _pick_lanes(old, new, by, max_jobs)
    lane = lanes(ax, names, short_ids(names) if by == "job" else None)
    drawn = Drawn()
    if not old.empty:
        g = drawn.add("recorded_lease")
        bars(ax, old["lane"].map(lane).to_numpy(), old["start"].to_numpy(),
             (old["end"] - old["start"]).to_numpy(), 0.8, "recorded_leases",
             facecolors=g.color, edgecolors=g.edge, linewidths=0.6, zorder=1.5)
    outcomes = new["outcome"].tolist()
    for o in OUTCOME_COLORS:
        if o in outcomes:
            drawn.add(o)
    if not new.empty:
        bars(ax, new["lane"].map(lane).to_numpy(), new["start"].to_numpy(),
             (new["end"] - new["start"]).to_numpy(), 0.4, "leases",
             facecolors=[OUTCOME_COLORS[o] for o in outcomes], edgecolors="0.1",
             linewidths=0.6, zorder=2)
    if by == "slot":
        _crash_marks(ax, rec, lane, drawn, window)
    if window is not None:
        ax.set_xlim(lo, hi)
    else:
        ax.set_xlim(left=0)
    legend(ax, drawn, "coloured: replayed,\nby outcome", note)
    return done(fig, ax, owned)


def _pick_lanes(old: pd.DataFrame, new: pd.DataFrame, by: str, max_jobs: int
                ) -> tuple[list[str], pd.DataFrame, pd.DataFrame, str]:
    """(lane names, the two runs' leases on them with a ``lane`` column, the legend's note)."""
    key = (lambda df: df["worker"].map(_slot)) if by == "slot" else (lambda df: df["job_id"])
    old, new = old.assign(lane=key(old)), new.assign(lane=key(new))
    if by == "slot":
        return sorted(set(old["lane"]) | set(new["lane"])), old, new, ""
    counts = pd.concat([old["lane"], new["lane"]]).value_counts(sort=False)
    names = list(dict.fromkeys([*old["lane"], *new["lane"]]))  # first-claim order
    chosen = set(sorted(names, key=lambda j: -counts[j])[:max_jobs])
    names = [j for j in names if j in chosen]
    note = "" if len(names) >= len(counts) else f"{len(names)} of {len(counts):,} jobs shown"
    return names, old[old["lane"].isin(chosen)], new[new["lane"].isin(chosen)], note


def _crash_marks(ax: Axes, trace: Trace, lane: dict[str, int], drawn: Drawn,
                 window: tuple[float, float] | None) -> None:
    """The recording's crashes (and returns) on every lane of the node, inside ``window``."""
    lo, hi = (-math.inf, math.inf) if window is None else (float(window[0]), float(window[1]))
    for kind, gid, moment in (("crashed", "crash", lambda c: c["t"]),
                              ("restarted", "restart", lambda c: None if c["restart_after"]
                               is None else c["t"] + c["restart_after"])):
        points = [(x, y) for c in trace.crashes if (x := moment(c)) is not None and lo <= x <= hi
                  for name, y in lane.items() if name.split(" #", 1)[0] == c["node"]]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.scatter(xs, ys, zorder=3, gid=gid, clip_on=False,
                       **drawn.add(kind).scatter_style())


def replay_depth(recorded: RunLike, replayed: RunLike, ax: Axes | None = None,
                 title: str | None = None) -> Figure:
    """Ready and leased job counts of the recording (solid, gid ``"depth_<state>"``) and of the
    replay (dashed, gid ``"depth_<state>_replayed"``) over seconds from each run's first
    arrival, each held until that run's last event. A series of more than 400 changes is drawn
    as its time-weighted mean per bin (200 bins), as ``depth_chart`` draws it."""
    rec = as_trace(recorded)
    rep = as_trace(replayed, rec.queue or None)
    fig, ax, owned = axes_for(ax, (9, 3.5))
    label(ax, title or "Ready and leased jobs: recorded vs replayed", AXIS_LABEL,
          "jobs (count)")
    drawn = Drawn()
    resampled = False
    for trace, suffix in ((rec, ""), (rep, "_replayed")):
        depth = depth_frame(trace.frame)
        if depth.empty:
            continue
        x = np.append(depth["t"].to_numpy(), trace.t0 + trace.span_s) - trace.t0
        for state in ("ready", "leased"):
            y = depth[state].to_numpy().astype(float)
            if not y.any():
                continue
            g = drawn.add(f"depth_{state}{suffix}")
            style = {"color": g.color, "linestyle": g.linestyle, "linewidth": 1.8,
                     "gid": f"depth_{state}{suffix}", "where": "post"}
            if len(x) - 1 > _MAX_STEPS and x[-1] > x[0]:
                edges, mean, _lo, _hi = step_bins(x, np.append(y, y[-1]), _BINS)
                ax.step(edges, np.append(mean, mean[-1]), **style)
                resampled = True
            else:
                ax.step(x, np.append(y, y[-1]), **style)
    if not drawn.keys:
        no_events(ax)
        return done(fig, ax, owned)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    legend(ax, drawn, "solid: recorded,\ndashed: replayed",
           "(mean per bin)" if resampled else "")
    return done(fig, ax, owned)
