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
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from istos import events as ev
from istos_nb.views.chartkit import (
    BAR_EDGE,
    CRASH_STYLE,
    DEPTH_COLORS,
    FINISH_COLORS,
    LEGEND,
    OUTCOME_COLORS,
    RESTART_STYLE,
    TIME_LABEL,
    Labels,
    axes_for,
    bars,
    done,
    label,
    lanes,
    no_events,
    outcome_handles,
    resize,
    short_ids,
    span,
    step_bins,
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

__all__ = [
    "DEPTH_COLORS", "FINISH_COLORS", "OUTCOME_COLORS", "attempts_histogram", "backoff_band",
    "backoff_curve", "depth_chart", "lease_gantt", "resize", "retry_timeline",
    "throughput_chart",
]

_RATE_STYLE = {  # throughput column -> (colour, legend label)
    "enqueued": ("tab:gray", "enqueued"),
    "acked": (OUTCOME_COLORS["acked"], "acked"),
    "nacked": (OUTCOME_COLORS["nacked"], "nacked"),
    "expired": (OUTCOME_COLORS["expired"], "lease expired"),
    "dead_lettered": ("black", "dead-lettered"),
}
_UNKNOWN_WORKER = "(unknown)"
_MAX_BAND_ATTEMPTS = 16
_DEPTH_MAX_STEPS = 400  # more changes than this are resampled (see step_bins)
_DEPTH_BINS = 200
_HALF_STRIP = 0.35  # the band's flat half-width around each attempt; dots spread over ±0.3
_REDELIVERY = {"colors": "0.25", "linestyles": (0, (3, 2)), "linewidths": 1.2}


def _redeliveries(leases: pd.DataFrame, lane_of: np.ndarray, start: np.ndarray,
                  end: np.ndarray) -> list[list[tuple[float, float]]]:
    """One segment per expired lease: from its end on its lane to the next claim of the job."""
    segments = []
    next_of: dict[str, int] = {}
    jobs, outcomes = leases["job_id"].tolist(), leases["outcome"].tolist()
    for i in range(len(jobs) - 1, -1, -1):  # backwards: the next claim is already known
        if outcomes[i] == "expired" and jobs[i] in next_of:
            j = next_of[jobs[i]]
            segments.append([(end[i], lane_of[i]), (start[j], lane_of[j])])
        next_of[jobs[i]] = i
    return segments[::-1]


def lease_gantt(events: EventsLike, ax: Axes | None = None,
                title: str | None = None) -> Figure:
    """One lane per worker slot (sorted by name), one outlined bar per lease coloured by outcome.

    All bars form one PolyCollection (gid ``"leases"``) holding exactly one rectangle path per
    lease, in claim order as in ``leases_frame``, each face coloured by ``OUTCOME_COLORS``;
    open leases run to the last event of the stream. A dashed line (gid ``"redelivery"``, one
    segment per expired lease in claim order) runs from each expired lease's end to the next
    claim of the same job, wherever it landed. Each heartbeat renewal (``lease_extended``)
    draws a black tick (gid ``"renewal"``) on its holder's lane at the renewal time. A node
    crash draws a white-ringed black ``X`` (gid ``"crash"``) on every lane of that node; a
    restart a black-ringed white triangle (``"restart"``).
    """
    df = events_frame(events)
    fig, ax, owned = axes_for(ax, (10, 4))
    label(ax, title or "Leases by worker slot", TIME_LABEL, "worker slot")
    leases = leases_frame(df)
    if leases.empty:
        no_events(ax)
        return done(fig, ax, owned)
    t0, t_end = span(df)
    workers = leases["worker"].where(leases["worker"].notna(), _UNKNOWN_WORKER)
    lane = lanes(ax, sorted(set(workers)))
    y = np.array([lane[w] for w in workers], dtype=float)
    start = leases["start"].to_numpy() - t0
    end = leases["end"].fillna(t_end).to_numpy() - t0
    bars(ax, y, start, end - start, 0.7, "leases",
         facecolors=[OUTCOME_COLORS[o] for o in leases["outcome"]], **BAR_EDGE)
    ax.set_xlim(left=0)  # the axis starts at the first event, not at the first claim
    extra: list[Any] = []
    segments = _redeliveries(leases, y, start, end)
    if segments:
        ax.add_collection(LineCollection(segments, gid="redelivery", zorder=2.5, **_REDELIVERY))
        extra.append(Line2D([], [], color="0.25", linestyle=(0, (3, 2)),
                            label="expired → next claim"))
    renewed = df[df["kind"] == ev.LEASE_EXTENDED]
    ticks = [(t - t0, lane[w]) for t, w in zip(renewed["t"], renewed["worker"], strict=True)
             if w in lane]
    if ticks:
        xs, ys = zip(*ticks, strict=True)
        ax.scatter(xs, ys, marker="|", s=90, color="black", linewidths=1.2, zorder=2.8,
                   gid="renewal")
        extra.append(Line2D([], [], marker="|", color="black", linestyle="none",
                            markersize=9, label="lease renewed"))
    nodes = node_events_frame(df)
    for kind, style, gid in ((ev.CRASHED, CRASH_STYLE, "crash"),
                             (ev.RESTARTED, RESTART_STYLE, "restart")):
        points = [(t - t0, i) for t, node, k in nodes.itertuples(index=False) if k == kind
                  for w, i in lane.items() if worker_node(w) == node]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.scatter(xs, ys, zorder=3, gid=gid, **style)
            extra.append(Line2D([], [], marker=style["marker"], color=style["color"],
                                markeredgecolor=style["edgecolors"], linestyle="none",
                                markersize=9, label=f"node {kind}"))
    ax.legend(handles=outcome_handles(extra), title="lease outcome", **LEGEND)
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
    with the most deliveries, shown in first-claim order. ``labels`` names the lanes: a
    mapping or a function from job id to text (an order number, an invoice); without it long
    generated ids are cut to their first 8 characters when that keeps them distinct. A
    dead-lettered job gets a white-ringed black ``X`` (gid ``"dead"``) at that time.
    """
    df = events_frame(events)
    fig, ax, owned = axes_for(ax, (10, 4))
    label(ax, title or "Retries per job", TIME_LABEL, "job")
    att = attempts_frame(df)
    jobs = _pick_jobs(att, job_ids, max_jobs)
    att = att[att["job_id"].isin(jobs)]
    if att.empty:
        no_events(ax)
        return done(fig, ax, owned)
    t0, t_end = span(df)
    lane = lanes(ax, jobs, labels if labels is not None else short_ids(jobs))
    y = att["job_id"].map(lane).to_numpy()
    start = att["claimed_at"].to_numpy() - t0
    end = att["finished_at"].fillna(t_end).to_numpy() - t0
    bars(ax, y, start, end - start, 0.6, "attempts",
         facecolors=[OUTCOME_COLORS[o] for o in att["outcome"]], **BAR_EDGE)
    gaps = att[att["waited_s"].notna()]
    waited = gaps["waited_s"].to_numpy()
    bars(ax, gaps["job_id"].map(lane).to_numpy(), gaps["claimed_at"].to_numpy() - t0 - waited,
         waited, 0.3, "backoff", facecolors="0.92", edgecolors="0.55", hatch="///",
         linewidths=0.5)
    ax.set_xlim(left=0)
    extra: list[Any] = [Patch(facecolor="0.92", edgecolor="0.55", hatch="///",
                              label="wait before retry")]
    dead = df[(df["kind"] == ev.DEAD_LETTERED) & df["job_id"].isin(jobs)]
    if not dead.empty:
        ax.scatter(dead["t"] - t0, dead["job_id"].map(lane), zorder=3, gid="dead",
                   **CRASH_STYLE)
        extra.append(Line2D([], [], marker="X", color="black", markeredgecolor="white",
                            linestyle="none", markersize=9, label="dead-lettered"))
    ax.legend(handles=outcome_handles(extra), title="attempt outcome", **LEGEND)
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
    fig, ax, owned = axes_for(ax, (7, 4))
    label(ax, title or "Retry backoff: policy vs observed", "failed attempt number",
          "retry delay (s)")
    retries = df[df["kind"] == ev.RETRY_SCHEDULED]
    observed_max = int(retries["attempt"].max()) if not retries.empty else 0
    x = np.arange(1, _band_attempts(retry_backoff_s, retry_backoff_max_s, observed_max,
                                    max_attempts) + 1)
    nominal, low, high = backoff_band(x, retry_backoff_s, retry_backoff_max_s, retry_jitter)
    # Flat across each attempt's strip of dots (x ± _HALF_STRIP), sloped in between.
    xs = np.ravel(np.column_stack([x - _HALF_STRIP, x + _HALF_STRIP]))
    ax.fill_between(xs, np.repeat(low, 2), np.repeat(high, 2), color="tab:blue", alpha=0.2,
                    gid="backoff_band", label=f"policy band (jitter ±{retry_jitter:g})")
    ax.plot(xs, np.repeat(nominal, 2), "-", color="tab:blue", gid="backoff_nominal",
            label="policy nominal")
    delayed = retries[retries["delay_s"] > 0]
    immediate = retries[retries["delay_s"] == 0]
    alpha = 0.7 if len(delayed) < 100 else 0.35
    if not delayed.empty:
        ax.scatter(_strip(delayed["attempt"].to_numpy()), delayed["delay_s"], color="black",
                   s=10, alpha=alpha, linewidths=0, zorder=3, gid="observed", clip_on=False,
                   label="observed delay")
    if not immediate.empty:
        ax.scatter(_strip(immediate["attempt"].to_numpy()), immediate["delay_s"],
                   facecolors="none", edgecolors="tab:red", s=30, zorder=3, clip_on=False,
                   gid="observed_immediate", label="immediate retry (delay 0)")
    if retries.empty:
        no_events(ax, "no events (no retries observed)")
    ax.set_ylim(bottom=0)  # delays are never negative; a "-1" tick collided with the x ticks
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(**LEGEND)
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
    x = np.append(depth["t"].to_numpy(), t_end) - t0
    resample = len(depth) > _DEPTH_MAX_STEPS and x[-1] > x[0]
    for state, color in DEPTH_COLORS.items():
        y = depth[state].to_numpy()
        if not resample:
            ax.step(x, np.append(y, y[-1]), where="post", color=color, label=state,
                    gid=f"depth_{state}")
            continue
        edges, mean, lo, hi = step_bins(x, np.append(y, y[-1]).astype(float), _DEPTH_BINS)
        ax.fill_between(edges, np.append(lo, lo[-1]), np.append(hi, hi[-1]), step="post",
                        color=color, alpha=0.18, linewidth=0, gid=f"depth_{state}_range")
        ax.step(edges, np.append(mean, mean[-1]), where="post", color=color, label=state,
                gid=f"depth_{state}")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    ax.legend(title="state" + (" (mean per bin, band: min–max)" if resample else ""),
              **LEGEND)
    return done(fig, ax, owned)


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
    ax.bar(x, n_done, color=FINISH_COLORS["done"], label="done", gid="done")
    ax.bar(x, n_dead, bottom=n_done, color=FINISH_COLORS["dead"], label="dead", gid="dead")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(**LEGEND)
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
    edges = np.append(tp["t"].to_numpy(), tp["t"].iloc[-1] + bin_s) - t0
    for column, (color, name) in _RATE_STYLE.items():
        ax.stairs(tp[column].to_numpy() / bin_s, edges, color=color, label=name,
                  gid=f"rate_{column}", linestyle="--" if column == "enqueued" else "-")
    ax.legend(**LEGEND)
    return done(fig, ax, owned)
