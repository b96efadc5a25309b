"""Matplotlib figures built from the frames in :mod:`istos_nb.data.frames`.

One module at two layers: this implementation, and its public name :mod:`istos_nb.charts`.

Every chart accepts events in any form ``events_frame`` accepts, plus optional ``ax`` (draw into
an existing Axes; the returned Figure is that Axes' root figure) and ``title``. Charts use the
object-oriented API only (``Figure`` + ``fig.subplots()``), never pyplot's global state, so they
are safe to build from worker threads and inside notebooks. Time is shown relative to the first
event of the stream, in seconds (for a live stream labelled with the wall-clock time). The
time charts take ``window=(start, end)`` on the stream's clock to show exactly that span (the
live dashboard gives all of them one span ending at the refresh instant).

Every artist a test or widget may want to find carries a ``gid``: ``"leases"`` (Gantt bars)
and ``"attempts"``/``"backoff"`` (retry timeline bars), each a PolyCollection with one outlined
path per bar; ``"redelivery"`` (a LineCollection: one dashed arc from each expired lease to
the next claim of that job); ``"backoff_band"``/``"backoff_nominal"``/``"observed"``/
``"observed_immediate"`` on the backoff curve; ``"crash"``/``"restart"``/``"renewal"``/
``"delivery_crashed"`` markers on the Gantt and ``"dead"`` (dead-lettered) on the retry
timeline; ``"depth_<state>"`` lines (and ``"depth_<state>_range"`` bands when resampled);
``"done"``/``"dead"`` histogram bars; ``"rate_<column>"`` throughput stairs. An empty stream
draws labelled axes with a "no events" note and never raises. :func:`resize` sets a chart's
size and refits its margins (the dashboards draw every chart at one width).

The chart contract (``tests/test_chart_contract.py``, over every chart function here): marks
come from the one vocabulary in :mod:`istos_nb.views.glyphs` and the legend names only what
was drawn; no two texts overlap; bars and markers are at least 2 px at the default size (thin
bars are widened) or the chart says how many of how many it shows; a stream stamped by a real
clock (epoch seconds) gets a wall-clock (UTC) time axis, virtual time stays seconds since the
first event. A new chart function must be registered there. The replay overlays
(:func:`replay_gantt`, :func:`replay_depth`, in :mod:`istos_nb.views.replay_charts`) take two
runs and keep seconds from each run's first arrival, so a recording and its replay line up.

Public as :mod:`istos_nb.charts`, which re-exports this module's ``__all__`` (one module at
two layers: the public name, and this implementation).
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
from istos.errors import ConfigError
from istos_nb.data.frames import (
    EventsLike,
    attempts_frame,
    depth_frame,
    events_frame,
    jobs_frame,
    leases_frame,
    throughput_frame,
)
from istos_nb.views.chartkit import (
    BAR_EDGE,
    DEPTH_COLORS,
    FINISH_COLORS,
    OUTCOME_COLORS,
    TIME_LABEL,
    Labels,
    Window,
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
    time_window,
)
from istos_nb.views.glyphs import Drawn
from istos_nb.views.leasemarks import ARC_BULGE, delivery_deaths, node_markers, redeliveries
from istos_nb.views.replay_charts import replay_depth, replay_gantt

__all__ = [
    "DEPTH_COLORS", "FINISH_COLORS", "OUTCOME_COLORS", "attempts_histogram", "backoff_band",
    "backoff_curve", "depth_chart", "lease_gantt", "replay_depth", "replay_gantt", "resize",
    "retry_timeline", "throughput_chart",
]

_RATES = ("enqueued", "acked", "nacked", "expired", "dead_lettered")  # throughput columns
_UNKNOWN_WORKER = "(unknown)"
_HIST_EDGE: dict[str, Any] = {"edgecolor": BAR_EDGE["edgecolors"], "linewidth": 0.6}
_MAX_BAND_ATTEMPTS = 16
_DEPTH_MAX_STEPS = 400  # more changes than this are resampled (see step_bins)
_DEPTH_BINS = 200
_HALF_STRIP = 0.35  # the band's flat half-width around each attempt; dots spread over ±0.3


def lease_gantt(events: EventsLike, ax: Axes | None = None,
                title: str | None = None, window: Window = None) -> Figure:
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
    streams get a wall-clock time axis. ``window`` (start, end) fixes the x span (open leases
    then run to its end: the live dashboard's "now").
    """
    df = events_frame(events)
    fig, ax, owned = axes_for(ax, (10, 4))
    label(ax, title or "Leases by worker slot", TIME_LABEL, "worker slot")
    leases = leases_frame(df)
    if leases.empty:
        no_events(ax)
        time_window(ax, window)
        return done(fig, ax, owned)
    t0, t_end = span(df, window)
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
    time_window(ax, window)
    segments = redeliveries(leases, y, start, end, ARC_BULGE * max(t_end - t0, 1e-9))
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
    node_markers(ax, df, lane, t0, drawn)
    delivery_deaths(ax, df, leases.reset_index(drop=True), y, t0, drawn)
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
                   title: str | None = None, labels: Labels = None,
                   window: Window = None) -> Figure:
    """One lane per job: each delivery an outlined bar coloured by outcome (gid ``"attempts"``,
    one path per delivery in claim order), and the wait between a delivery's end and the next
    claim a hatched light bar (gid ``"backoff"``, one path per retried delivery).

    ``job_ids`` picks the lanes (in that order, all of them); otherwise the ``max_jobs`` jobs
    with the most deliveries, shown in first-claim order, and the legend says "N of M jobs
    shown". ``labels`` names the lanes: a mapping or a function from job id to text (an order
    number, an invoice); without it long generated ids are cut to their first 8 characters
    when that keeps them distinct. A dead-lettered job gets a white-ringed black square (gid
    ``"dead"``) at that time. Bars too short to see are widened to 2 px. ``window`` (start,
    end) fixes the x span, as in :func:`lease_gantt`.
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
        time_window(ax, window)
        return done(fig, ax, owned)
    t0, t_end = span(df, window)
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
    time_window(ax, window)
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
    max and floored at 0. Raises ConfigError (a ValueError) for a negative base, max or jitter.
    """
    if min(retry_backoff_s, retry_backoff_max_s, retry_jitter) < 0:
        raise ConfigError("retry_backoff_s, retry_backoff_max_s and retry_jitter must be >= 0")
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
                title: str | None = None, window: Window = None) -> Figure:
    """Ready / leased / delayed / dead job counts over time (gid ``"depth_<state>"``), each
    held until the last event of the stream.

    Up to 400 changes are drawn exactly, as steps. A longer series (a count flickering 0 ↔ 1
    hundreds of times would paint a solid block) is resampled into 200 equal bins: the
    line is each bin's time-weighted mean, and a light band (gid ``"depth_<state>_range"``)
    spans each bin's min..max. ``window`` (start, end) fixes the x span; the last count is
    then held until its end.
    """
    df = events_frame(events)
    fig, ax, owned = axes_for(ax, (9, 3.5))
    label(ax, title or "Queue depth", TIME_LABEL, "jobs (count)")
    depth = depth_frame(df)
    if depth.empty:
        no_events(ax)
        time_window(ax, window)
        return done(fig, ax, owned)
    t0, t_end = span(df, window)
    t_end = max(t_end, float(depth["t"].iloc[-1]))  # a window ending early still holds steps
    time_axis(ax, t0)
    x = np.append(depth["t"].to_numpy(), t_end) - t0
    columns = {state: depth[state].to_numpy() for state in DEPTH_COLORS}
    resampled = _depth_lines(ax, x, columns)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    time_window(ax, window)
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
                     title: str | None = None, window: Window = None) -> Figure:
    """Events per second over time, per ``bin_s`` bin: acked, plus enqueued and the failure
    kinds (nacked, lease expired, dead-lettered) as stairs (gid ``"rate_<column>"``).
    ``window`` (start, end) fixes the x span. A live queue's rates are better read from its
    owner's series (:func:`istos_nb.views.series_charts.series_throughput_chart`): an event
    window covers seconds of a busy queue."""
    df = events_frame(events)
    fig, ax, owned = axes_for(ax, (9, 3.5))
    label(ax, title or f"Throughput ({bin_s:g} s bins)", TIME_LABEL,
          "events per second (1/s)")
    tp = throughput_frame(df, bin_s)
    if tp.empty:
        no_events(ax)
        time_window(ax, window)
        return done(fig, ax, owned)
    t0, _ = span(df, window)
    time_axis(ax, t0)
    edges = np.append(tp["t"].to_numpy(), tp["t"].iloc[-1] + bin_s) - t0
    drawn = Drawn()
    for column in _RATES:  # a kind that never happened is neither drawn nor named
        if not tp[column].any():
            continue
        g = drawn.add(f"rate_{column}")
        ax.stairs(tp[column].to_numpy() / bin_s, edges, color=g.color, linewidth=1.5,
                  gid=f"rate_{column}", linestyle=g.linestyle)
    time_window(ax, window)
    legend(ax, drawn, "events")
    return done(fig, ax, owned)
