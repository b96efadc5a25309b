"""Matplotlib figures built from the frames in :mod:`istos_nb.views.frames`.

Every chart accepts events in any form ``events_frame`` accepts, plus optional ``ax`` (draw into
an existing Axes; the returned Figure is that Axes' root figure) and ``title``. Charts use the
object-oriented API only (``Figure`` + ``fig.subplots()``), never pyplot's global state, so they
are safe to build from worker threads and inside notebooks. Time is shown relative to the first
event of the stream, in seconds, whichever world the events came from.

Every artist a test or widget may want to find carries a ``gid``: ``"leases"`` (Gantt bars)
and ``"attempts"``/``"backoff"`` (retry timeline bars), each a PolyCollection with one outlined
path per bar; ``"redelivery"`` (a LineCollection: one dashed segment from each expired lease to
the next claim of that job); ``"backoff_band"``/``"backoff_nominal"``/``"observed"``/
``"observed_immediate"`` on the backoff curve; ``"crash"``/``"restart"`` markers;
``"depth_<state>"`` lines (and ``"depth_<state>_range"`` bands when resampled); ``"done"``/
``"dead"`` histogram bars; ``"rate_<column>"`` throughput stairs. An empty stream draws
labelled axes with a "no events" note and never raises. :func:`resize` sets a chart's size and
refits its margins (the dashboards draw every chart at one width).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from istos import events as ev
from istos_nb.views.chartkit import (
    BAR_EDGE,
    DEPTH_COLORS,
    FINISH_COLORS,
    OUTCOME_COLORS,
    TIME_LABEL,
    Labels,
    axes_for,
    bars,
    done,
    label,
    lanes,
    legend,
    no_events,
    resize,
    short_ids,
    span,
    step_bins,
    time_axis,
)
from istos_nb.views.frames import (
    EventsLike,
    attempts_frame,
    depth_frame,
    events_frame,
    jobs_frame,
    leases_frame,
    node_events_frame,
    throughput_frame,
    worker_node,
)
from istos_nb.views.glyphs import Drawn

__all__ = [
    "DEPTH_COLORS", "FINISH_COLORS", "OUTCOME_COLORS", "attempts_histogram", "backoff_band",
    "backoff_curve", "depth_chart", "lease_gantt", "resize", "retry_timeline",
    "throughput_chart",
]

_RATES = ("enqueued", "acked", "nacked", "expired", "dead_lettered")  # throughput columns
_UNKNOWN_WORKER = "(unknown)"
_HIST_EDGE: dict[str, Any] = {"edgecolor": BAR_EDGE["edgecolors"], "linewidth": 0.6}
_MAX_BAND_ATTEMPTS = 16
_DEPTH_MAX_STEPS = 400  # more changes than this are resampled (see step_bins)
_DEPTH_BINS = 200
_HALF_STRIP = 0.35  # the band's flat half-width around each attempt; dots spread over ±0.3
_ARC_POINTS = 16
_ARC_BULGE = 0.012  # of the time axis per lane crossed: arcs of different length never stack
_DELIVERY_CRASHED = "delivery_crashed"  # the simulator's node event for a mid-job death


def _arc(x0: float, y0: float, x1: float, y1: float, bulge: float) -> list[tuple[float, float]]:
    """A quadratic curve from (x0, y0) to (x1, y1) bowed forward in time by ``bulge`` per lane
    crossed. Straight segments of leases that expired together stacked into one vertical line;
    arcs of different lane distance nest instead, each one visible."""
    cx, cy = max(x0, x1) + bulge * abs(y1 - y0), (y0 + y1) / 2
    s = np.linspace(0.0, 1.0, _ARC_POINTS)
    xs = (1 - s) ** 2 * x0 + 2 * (1 - s) * s * cx + s ** 2 * x1
    ys = (1 - s) ** 2 * y0 + 2 * (1 - s) * s * cy + s ** 2 * y1
    return list(zip(xs.tolist(), ys.tolist(), strict=True))


def _redeliveries(leases: pd.DataFrame, lane_of: np.ndarray, start: np.ndarray,
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


def _node_markers(ax: Axes, df: pd.DataFrame, lane: dict[str, int], t0: float,
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


def _delivery_deaths(ax: Axes, df: pd.DataFrame, leases: pd.DataFrame, y: np.ndarray,
                     t0: float, drawn: Drawn) -> None:
    """A marker (gid ``delivery_crashed``) where a delivery died mid-job while its node stayed
    up: without it, the red bar that follows (the lease running out) has nothing to explain it."""
    deaths = df[df["kind"] == _DELIVERY_CRASHED]
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


def lease_gantt(events: EventsLike, ax: Axes | None = None,
                title: str | None = None) -> Figure:
    """One lane per worker slot (sorted by name), one outlined bar per lease coloured by outcome.

    All bars form one PolyCollection (gid ``"leases"``) holding exactly one rectangle path per
    lease, in claim order as in ``leases_frame``, each face coloured by ``OUTCOME_COLORS``;
    open leases run to the last event of the stream; a lease too short to see is widened to
    2 px. A dashed arc (gid ``"redelivery"``, one path per expired lease in claim order) runs
    from each expired lease's end to the next claim of the same job, wherever it landed. Each
    heartbeat renewal (``lease_extended``) draws a black tick (gid ``"renewal"``) on its
    holder's lane. A node crash draws a white-ringed black ``X`` (gid ``"crash"``) on every
    lane of that node; a restart a black-ringed white triangle (``"restart"``); a delivery
    that died mid-job on a live node (the simulator's ``delivery_crashed``) a red triangle
    (``"delivery_crashed"``). The legend names only what is drawn (see ``glyphs.py``); live
    streams get a wall-clock time axis.
    """
    df = events_frame(events)
    fig, ax, owned = axes_for(ax, (10, 4))
    label(ax, title or "Leases by worker slot", TIME_LABEL, "worker slot")
    leases = leases_frame(df)
    if leases.empty:
        no_events(ax)
        return done(fig, ax, owned)
    t0, t_end = span(df)
    time_axis(ax, t0)
    drawn = Drawn()
    workers = leases["worker"].where(leases["worker"].notna(), _UNKNOWN_WORKER)
    lane = lanes(ax, sorted(set(workers)))
    y = np.array([lane[w] for w in workers], dtype=float)
    start = leases["start"].to_numpy() - t0
    end = leases["end"].fillna(t_end).to_numpy() - t0
    outcomes = leases["outcome"].tolist()
    for o in OUTCOME_COLORS:  # legend in the vocabulary's order, only outcomes that occur
        if o in outcomes:
            drawn.add(o)
    bars(ax, y, start, end - start, 0.7, "leases",
         facecolors=[OUTCOME_COLORS[o] for o in outcomes], **BAR_EDGE)
    ax.set_xlim(left=0)  # the axis starts at the first event, not at the first claim
    segments = _redeliveries(leases, y, start, end, _ARC_BULGE * max(t_end - t0, 1e-9))
    if segments:
        g = drawn.add("redelivery")
        ax.add_collection(LineCollection(segments, gid="redelivery", zorder=2.5,
                                         colors=g.color, linestyles=g.linestyle,
                                         linewidths=1.2))
    renewed = df[df["kind"] == ev.LEASE_EXTENDED]
    ticks = [(t - t0, lane[w]) for t, w in zip(renewed["t"], renewed["worker"], strict=True)
             if w in lane]
    if ticks:
        xs, ys = zip(*ticks, strict=True)
        ax.scatter(xs, ys, zorder=2.8, gid="renewal",
                   **{**drawn.add("renewal").scatter_style(), "s": 90})
    _node_markers(ax, df, lane, t0, drawn)
    _delivery_deaths(ax, df, leases.reset_index(drop=True), y, t0, drawn)
    legend(ax, drawn, "lease outcome")
    return done(fig, ax, owned)


def _pick_jobs(att: pd.DataFrame, job_ids: Sequence[str] | None, max_jobs: int) -> list[str]:
    if job_ids is not None:
        return list(dict.fromkeys(job_ids))
    deliveries = Counter(att["job_id"].tolist())  # insertion order = first-claim order
    order = list(deliveries)
    # The most-retried jobs are the interesting ones; a stable sort keeps first-claim order
    # among equals, and the lanes are shown in first-claim order.
    chosen = set(sorted(order, key=lambda j: -deliveries[j])[:max_jobs])
    return [j for j in order if j in chosen]


def retry_timeline(events: EventsLike, job_ids: Sequence[str] | None = None,
                   max_jobs: int = 20, ax: Axes | None = None,
                   title: str | None = None, labels: Labels = None) -> Figure:
    """One lane per job: each delivery an outlined bar coloured by outcome (gid ``"attempts"``,
    one path per delivery in claim order), and the wait between a delivery's end and the next
    claim a hatched light bar (gid ``"backoff"``, one path per retried delivery).

    ``job_ids`` picks the lanes (in that order, all of them); otherwise the ``max_jobs`` jobs
    with the most deliveries, shown in first-claim order, and the legend says "N of M jobs
    shown". ``labels`` names the lanes: a mapping or a function from job id to text (an order
    number, an invoice); without it long generated ids are cut to their first 8 characters
    when that keeps them distinct. A dead-lettered job gets a white-ringed black square (gid
    ``"dead"``) at that time. Bars too short to see are widened to 2 px.
    """
    df = events_frame(events)
    fig, ax, owned = axes_for(ax, (10, 4))
    label(ax, title or "Retries per job", TIME_LABEL, "job")
    att = attempts_frame(df)
    total = att["job_id"].nunique()
    jobs = _pick_jobs(att, job_ids, max_jobs)
    att = att[att["job_id"].isin(jobs)]
    if att.empty:
        no_events(ax)
        return done(fig, ax, owned)
    t0, t_end = span(df)
    time_axis(ax, t0)
    drawn = Drawn()
    lane = lanes(ax, jobs, labels if labels is not None else short_ids(jobs))
    y = att["job_id"].map(lane).to_numpy()
    start = att["claimed_at"].to_numpy() - t0
    end = att["finished_at"].fillna(t_end).to_numpy() - t0
    outcomes = att["outcome"].tolist()
    for o in OUTCOME_COLORS:
        if o in outcomes:
            drawn.add(o)
    bars(ax, y, start, end - start, 0.6, "attempts",
         facecolors=[OUTCOME_COLORS[o] for o in outcomes], **BAR_EDGE)
    gaps = att[att["waited_s"] > 0]  # an immediate re-claim has no wait to draw
    if not gaps.empty:
        g = drawn.add("wait")
        waited = gaps["waited_s"].to_numpy()
        bars(ax, gaps["job_id"].map(lane).to_numpy(),
             gaps["claimed_at"].to_numpy() - t0 - waited, waited, 0.3, "backoff",
             facecolors=g.color, edgecolors=g.edge, hatch=g.hatch, linewidths=0.5)
    ax.set_xlim(left=0)
    dead = df[(df["kind"] == ev.DEAD_LETTERED) & df["job_id"].isin(jobs)]
    if not dead.empty:
        ax.scatter(dead["t"] - t0, dead["job_id"].map(lane), zorder=3, gid="dead",
                   **drawn.add("dead_lettered").scatter_style())
    shown = "" if len(jobs) >= total else f"{len(jobs)} of {total:,} jobs shown"
    legend(ax, drawn, "attempt outcome",
           shown + ("\n(the most delivered)" if shown and job_ids is None else ""))
    return done(fig, ax, owned)


def backoff_band(attempts: Sequence[int] | np.ndarray, retry_backoff_s: float,
                 retry_backoff_max_s: float,
                 retry_jitter: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(nominal, low, high) retry delay for each failed attempt number ``n`` (1-based).

    nominal = min(base * 2**(n-1), max); low/high = nominal * (1 -/+ jitter), each capped at
    max and floored at 0. Raises ValueError for a negative base, max or jitter.
    """
    if min(retry_backoff_s, retry_backoff_max_s, retry_jitter) < 0:
        raise ValueError("retry_backoff_s, retry_backoff_max_s and retry_jitter must be >= 0")
    n = np.asarray(attempts, dtype=float)
    nominal = np.minimum(retry_backoff_s * 2.0 ** (n - 1), retry_backoff_max_s)
    low = np.clip(nominal * (1 - retry_jitter), 0.0, retry_backoff_max_s)
    high = np.clip(nominal * (1 + retry_jitter), 0.0, retry_backoff_max_s)
    return nominal, low, high


def _band_attempts(base: float, cap: float, observed_max: int, max_attempts: int | None) -> int:
    # Up to one attempt past where the curve reaches the cap, and every observed point; the
    # last attempt of a queue never retries, so with max_attempts known the band stops before.
    if max_attempts is not None:
        return max(observed_max, max_attempts - 1, 1)
    reach = 1 if base <= 0 or cap <= base else 1 + math.ceil(math.log2(cap / base))
    return max(observed_max, min(reach + 1, _MAX_BAND_ATTEMPTS), 3)


def _strip(attempts: np.ndarray, width: float = 0.6) -> np.ndarray:
    """x positions spreading the dots of each attempt evenly over ``width`` (a strip plot):
    hundreds of delays at one attempt number would otherwise overplot into a bar."""
    x = attempts.astype(float)
    for n in np.unique(attempts):
        idx = np.flatnonzero(attempts == n)
        if len(idx) > 1:
            x[idx] += np.linspace(-width / 2, width / 2, len(idx))
    return x


def backoff_curve(events: EventsLike, retry_backoff_s: float, retry_backoff_max_s: float,
                  retry_jitter: float, ax: Axes | None = None, title: str | None = None,
                  max_attempts: int | None = None) -> Figure:
    """Configured backoff policy against observed retry delays.

    x = the attempt number that failed, y = delay in seconds. The policy band (see
    :func:`backoff_band`) is a shaded ``fill_between`` (gid ``"backoff_band"``), the nominal
    curve a line (``"backoff_nominal"``), both flat over x = n ± 0.35 for each attempt n;
    with ``max_attempts`` both stop at the last attempt that can retry (``max_attempts -
    1``). Observed ``retry_scheduled`` delays > 0 are filled
    dots (``"observed"``), immediate retries (delay 0, e.g. after a lease expiry) hollow dots
    (``"observed_immediate"``); the dots of one attempt are spread sideways across ±0.3 so
    each stays visible, in event order. With no events the band is still drawn, with a note.
    """
    df = events_frame(events)
    # 9 in wide: at 7 in the legend took more than half the figure (notebook 04).
    fig, ax, owned = axes_for(ax, (9, 4))
    label(ax, title or "Retry backoff: policy vs observed", "failed attempt number",
          "retry delay (s)")
    drawn = Drawn()
    retries = df[df["kind"] == ev.RETRY_SCHEDULED]
    observed_max = int(retries["attempt"].max()) if not retries.empty else 0
    x = np.arange(1, _band_attempts(retry_backoff_s, retry_backoff_max_s, observed_max,
                                    max_attempts) + 1)
    nominal, low, high = backoff_band(x, retry_backoff_s, retry_backoff_max_s, retry_jitter)
    # Flat across each attempt's strip of dots (x ± _HALF_STRIP), sloped in between.
    xs = np.ravel(np.column_stack([x - _HALF_STRIP, x + _HALF_STRIP]))
    band = drawn.add("policy_band")
    ax.fill_between(xs, np.repeat(low, 2), np.repeat(high, 2), facecolor=band.color,
                    edgecolor=band.edge, linewidth=0.6, gid="backoff_band")
    ax.plot(xs, np.repeat(nominal, 2), "-", color=drawn.add("policy_nominal").color,
            linewidth=1.8, gid="backoff_nominal")
    delayed = retries[retries["delay_s"] > 0]
    immediate = retries[retries["delay_s"] == 0]
    alpha = 0.7 if len(delayed) < 100 else 0.35
    if not delayed.empty:
        g = drawn.add("observed")
        ax.scatter(_strip(delayed["attempt"].to_numpy()), delayed["delay_s"], color=g.color,
                   s=g.size ** 2, alpha=alpha, linewidths=0, zorder=3, gid="observed",
                   clip_on=False)
    if not immediate.empty:
        g = drawn.add("observed_immediate")
        ax.scatter(_strip(immediate["attempt"].to_numpy()), immediate["delay_s"],
                   facecolors="none", edgecolors=g.edge, s=g.size ** 2, zorder=3,
                   clip_on=False, gid="observed_immediate")
    if retries.empty:
        no_events(ax, "no events (no retries observed)")
    ax.set_ylim(bottom=0)  # delays are never negative; a "-1" tick collided with the x ticks
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    legend(ax, drawn, f"jitter ±{retry_jitter:g}")
    return done(fig, ax, owned)


def depth_chart(events: EventsLike, ax: Axes | None = None,
                title: str | None = None) -> Figure:
    """Ready / leased / delayed / dead job counts over time (gid ``"depth_<state>"``), each
    held until the last event of the stream.

    Up to 400 changes are drawn exactly, as steps. A longer series (a count flickering 0 ↔ 1
    hundreds of times would paint a solid block) is resampled into 200 equal bins: the
    line is each bin's time-weighted mean, and a light band (gid ``"depth_<state>_range"``)
    spans each bin's min..max.
    """
    df = events_frame(events)
    fig, ax, owned = axes_for(ax, (9, 3.5))
    label(ax, title or "Queue depth", TIME_LABEL, "jobs (count)")
    depth = depth_frame(df)
    if depth.empty:
        no_events(ax)
        return done(fig, ax, owned)
    t0, t_end = span(df)
    time_axis(ax, t0)
    x = np.append(depth["t"].to_numpy(), t_end) - t0
    columns = {state: depth[state].to_numpy() for state in DEPTH_COLORS}
    resampled = _depth_lines(ax, x, columns)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    legend(ax, resampled, "state" + ("\n(line: mean per bin,\nband: min–max)"
                                     if len(depth) > _DEPTH_MAX_STEPS else ""))
    return done(fig, ax, owned)


def _depth_lines(ax: Axes, x: np.ndarray, columns: dict[str, np.ndarray]) -> Drawn:
    """Draw each count held from ``x[i]`` to ``x[i+1]`` (``x`` has one more entry); a count
    that never leaves 0 is not drawn (nor named). Separate from the frame so a series the
    owner keeps (counts per instant) can be drawn the same way."""
    drawn = Drawn()
    resample = len(x) - 1 > _DEPTH_MAX_STEPS and x[-1] > x[0]
    shown = [s for s, y in columns.items() if y.any()] or list(columns)[:1]
    for state in shown:
        y, g = columns[state], drawn.add(f"depth_{state}")
        if not resample:
            ax.step(x, np.append(y, y[-1]), where="post", color=g.color, linewidth=1.8,
                    gid=f"depth_{state}")
            continue
        edges, mean, lo, hi = step_bins(x, np.append(y, y[-1]).astype(float), _DEPTH_BINS)
        ax.fill_between(edges, np.append(lo, lo[-1]), np.append(hi, hi[-1]), step="post",
                        color=g.color, alpha=0.25, linewidth=0, gid=f"depth_{state}_range")
        ax.step(edges, np.append(mean, mean[-1]), where="post", color=g.color, linewidth=1.8,
                zorder=2.5, gid=f"depth_{state}")
    return drawn


def attempts_histogram(events: EventsLike, ax: Axes | None = None,
                       title: str | None = None) -> Figure:
    """Finished jobs by number of attempts, stacked: done (acked at least once, gid ``"done"``)
    below dead (dead-lettered, gid ``"dead"``). One bar of each per attempts count."""
    df = events_frame(events)
    fig, ax, owned = axes_for(ax, (6, 3.5))
    label(ax, title or "Attempts per finished job", "attempts (count)", "jobs (count)")
    jobs = jobs_frame(df)
    finished = jobs[jobs["finished_at"].notna()]
    if finished.empty:
        no_events(ax, "no events (no finished jobs)")
        return done(fig, ax, owned)
    lo, hi = min(1, int(finished["attempts"].min())), int(finished["attempts"].max())
    x = np.arange(lo, hi + 1)
    is_done = (finished["acks"] > 0).to_numpy()
    attempts = finished["attempts"].to_numpy() - lo
    n_done = np.bincount(attempts[is_done], minlength=len(x))
    n_dead = np.bincount(attempts[~is_done], minlength=len(x))
    drawn = Drawn()
    if n_done.any():
        ax.bar(x, n_done, color=drawn.add("acked").color, gid="done", **_HIST_EDGE)
    if n_dead.any():
        ax.bar(x, n_dead, bottom=n_done, color=drawn.add("dead").color, gid="dead",
               **_HIST_EDGE)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.margins(y=0.08)  # the tallest bar never touches the frame
    legend(ax, drawn, "how it finished")
    return done(fig, ax, owned)


def throughput_chart(events: EventsLike, bin_s: float = 1.0, ax: Axes | None = None,
                     title: str | None = None) -> Figure:
    """Events per second over time, per ``bin_s`` bin: acked, plus enqueued and the failure
    kinds (nacked, lease expired, dead-lettered) as stairs (gid ``"rate_<column>"``)."""
    df = events_frame(events)
    fig, ax, owned = axes_for(ax, (9, 3.5))
    label(ax, title or f"Throughput ({bin_s:g} s bins)", TIME_LABEL,
          "events per second (1/s)")
    tp = throughput_frame(df, bin_s)
    if tp.empty:
        no_events(ax)
        return done(fig, ax, owned)
    t0, _ = span(df)
    time_axis(ax, t0)
    edges = np.append(tp["t"].to_numpy(), tp["t"].iloc[-1] + bin_s) - t0
    drawn = Drawn()
    for column in _RATES:  # a kind that never happened is neither drawn nor named
        if not tp[column].any():
            continue
        g = drawn.add(f"rate_{column}")
        ax.stairs(tp[column].to_numpy() / bin_s, edges, color=g.color, linewidth=1.5,
                  gid=f"rate_{column}", linestyle=g.linestyle)
    legend(ax, drawn, "events")
    return done(fig, ax, owned)
