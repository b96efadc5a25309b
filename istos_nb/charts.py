"""Matplotlib figures built from the frames in :mod:`istos_nb.frames`.

Every chart accepts events in any form ``events_frame`` accepts, plus optional ``ax`` (draw into
an existing Axes; the returned Figure is that Axes' root figure) and ``title``. Charts use the
object-oriented API only (``Figure`` + ``fig.subplots()``), never pyplot's global state, so they
are safe to build from worker threads and inside notebooks. Time is shown relative to the first
event of the stream, in seconds, whichever world the events came from.

Every artist a test or widget may want to find carries a ``gid``: ``"leases"`` (Gantt bars)
and ``"attempts"``/``"backoff"`` (retry timeline bars), each a PolyCollection with one path per
bar; ``"backoff_band"``/``"backoff_nominal"``/``"observed"``/``"observed_immediate"`` on the
backoff curve; ``"crash"``/``"restart"`` markers; ``"depth_<state>"`` lines; ``"done"``/
``"dead"`` histogram bars; ``"rate_<column>"`` throughput stairs. An empty stream draws
labelled axes with a "no events" note and never raises.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from istos import events as ev
from istos_nb.frames import (
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
    "backoff_curve", "depth_chart", "lease_gantt", "retry_timeline", "throughput_chart",
]

# One colour per meaning, the same in every chart, so a glance transfers between them.
OUTCOME_COLORS: dict[str, str] = {
    "acked": "tab:green", "nacked": "tab:orange", "expired": "tab:red", "open": "tab:gray",
}
FINISH_COLORS: dict[str, str] = {"done": "tab:green", "dead": "tab:red"}
DEPTH_COLORS: dict[str, str] = {
    "ready": "tab:blue", "leased": "tab:purple", "delayed": "tab:olive", "dead": "tab:red",
}
_RATE_STYLE = {  # throughput column -> (colour, legend label)
    "enqueued": ("tab:gray", "enqueued"),
    "acked": (OUTCOME_COLORS["acked"], "acked"),
    "nacked": (OUTCOME_COLORS["nacked"], "nacked"),
    "expired": (OUTCOME_COLORS["expired"], "lease expired"),
    "dead_lettered": ("black", "dead-lettered"),
}
_TIME_LABEL = "time since first event (s)"
_UNKNOWN_WORKER = "(unknown)"
_MAX_BAND_ATTEMPTS = 16
_CHAR_IN = 0.085  # mean glyph width of the default 10 pt font, inches (for margin estimates)
_LEGEND = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "fontsize": "small"}


def _axes(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes, bool]:
    """(figure, axes, owned): a new Figure when ``ax`` is None, else ``ax``'s root figure."""
    if ax is None:
        fig = Figure(figsize=figsize)
        return fig, fig.subplots(), True
    fig = ax.figure
    # An Axes inside a SubFigure: hand back the root Figure, which is what callers display.
    while not isinstance(fig, Figure) and getattr(fig, "figure", fig) is not fig:
        fig = fig.figure
    return fig, ax, False


def _done(fig: Figure, ax: Axes, owned: bool) -> Figure:
    """Size the margins of a figure we created; a caller's own figure keeps its layout."""
    if owned:
        _fit(fig, ax)
    return fig


def _fit(fig: Figure, ax: Axes) -> None:
    # Margins are estimated from label lengths instead of running a layout engine: constrained
    # layout measures every text twice per draw, which doubled the dashboard's render time.
    # Tick label texts, not the formatter's ``seq``: matplotlib >= 3.10 wraps fixed labels in
    # a FuncFormatter that has no ``seq``, which left lane names cut off.
    lanes = [t.get_text() for t in ax.get_yticklabels() if t.get_text()] \
        if ax.yaxis.get_major_formatter().__class__.__name__ in ("FixedFormatter",
                                                                  "FuncFormatter") else []
    width, height = fig.get_size_inches()
    if lanes:  # one readable row per lane, within reason
        height = min(max(height, 1.3 + 0.28 * len(lanes)), 14.0)
        fig.set_size_inches(width, height)
    left = 0.75 + _CHAR_IN * max((len(str(s)) for s in lanes), default=5)
    right = 0.2
    legend = ax.get_legend()
    if legend is not None:  # every legend sits outside, right of the axes
        texts = [t.get_text() for t in legend.get_texts()] + [legend.get_title().get_text()]
        right += 0.6 + 0.8 * _CHAR_IN * max(len(t) for t in texts)
    left_f, right_f = left / width, 1 - right / width
    if right_f - left_f < 0.2:  # a very narrow figure: keep the axes, lose some margin
        left_f, right_f = 0.1, 0.9
    fig.subplots_adjust(left=left_f, right=right_f, bottom=0.6 / height, top=1 - 0.4 / height)


def _label(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)


def _no_events(ax: Axes, text: str = "no events") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4",
            gid="no_events")


def _span(df: pd.DataFrame) -> tuple[float, float]:
    """(first, last) event time of the whole stream; charts subtract the first."""
    return float(df["t"].min()), float(df["t"].max())


def _outcome_handles(extra: Sequence[Any] = ()) -> list[Any]:
    return [Patch(facecolor=c, label=o) for o, c in OUTCOME_COLORS.items()] + list(extra)


def _lanes(ax: Axes, names: Sequence[str]) -> dict[str, int]:
    ax.set_yticks(range(len(names)), labels=list(names))
    ax.set_ylim(len(names) - 0.5, -0.5)  # first name on top, like a table
    return {name: i for i, name in enumerate(names)}


def _bars(ax: Axes, y: np.ndarray, left: np.ndarray, width: np.ndarray, height: float,
          gid: str, **style: Any) -> PolyCollection:
    """Horizontal bars as ONE PolyCollection with one rectangle path per bar, in input order.

    Thousands of leases as separate Rectangles (``barh``) take seconds to build and draw; one
    collection takes milliseconds and still gives one countable, individually coloured path
    per bar (``get_paths()`` / ``get_facecolor()``).
    """
    y, left, width = (np.asarray(a, dtype=float) for a in (y, left, width))
    lo, hi, right = y - height / 2, y + height / 2, left + width
    verts = np.stack([np.stack(corner, axis=-1) for corner in
                      ((left, lo), (left, hi), (right, hi), (right, lo))], axis=1)
    coll = PolyCollection(verts.reshape(-1, 4, 2), gid=gid, **style)
    ax.add_collection(coll)
    ax.autoscale_view()
    return coll


def lease_gantt(events: EventsLike, ax: Axes | None = None,
                title: str | None = None) -> Figure:
    """One lane per worker slot (sorted by name), one bar per lease coloured by outcome.

    All bars form one PolyCollection (gid ``"leases"``) holding exactly one rectangle path per
    lease, in claim order as in ``leases_frame``, each face coloured by ``OUTCOME_COLORS``;
    open leases run to the last event of the stream. A node crash draws a red
    ``x`` (gid ``"crash"``) on every lane of that node; a restart a black ``|`` (``"restart"``).
    """
    df = events_frame(events)
    fig, ax, owned = _axes(ax, (10, 4))
    _label(ax, title or "Leases by worker slot", _TIME_LABEL, "worker slot")
    leases = leases_frame(df)
    if leases.empty:
        _no_events(ax)
        return _done(fig, ax, owned)
    t0, t_end = _span(df)
    workers = leases["worker"].where(leases["worker"].notna(), _UNKNOWN_WORKER)
    lane = _lanes(ax, sorted(set(workers)))
    start = leases["start"].to_numpy() - t0
    end = leases["end"].fillna(t_end).to_numpy() - t0
    _bars(ax, np.array([lane[w] for w in workers]), start, end - start, 0.7, "leases",
          facecolors=[OUTCOME_COLORS[o] for o in leases["outcome"]], edgecolors="none")
    ax.set_xlim(left=0)  # the axis starts at the first event, not at the first claim
    extra = []
    nodes = node_events_frame(df)
    for kind, marker, color, gid in ((ev.CRASHED, "x", "red", "crash"),
                                     (ev.RESTARTED, "|", "black", "restart")):
        points = [(t - t0, i) for t, node, k in nodes.itertuples(index=False) if k == kind
                  for w, i in lane.items() if worker_node(w) == node]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.scatter(xs, ys, marker=marker, color=color, s=80, zorder=3, gid=gid)
            extra.append(Line2D([], [], marker=marker, color=color, linestyle="none",
                                label=f"node {kind}"))
    ax.legend(handles=_outcome_handles(extra), title="lease outcome", **_LEGEND)
    return _done(fig, ax, owned)


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
                   title: str | None = None) -> Figure:
    """One lane per job: each delivery a bar coloured by outcome (gid ``"attempts"``, one path
    per delivery in claim order), and the wait between a delivery's end and the next claim a
    hatched light bar (gid ``"backoff"``, one path per retried delivery).

    ``job_ids`` picks the lanes (in that order, all of them); otherwise the ``max_jobs`` jobs
    with the most deliveries, shown in first-claim order. A dead-lettered job gets a black
    ``X`` (gid ``"dead"``) at that time.
    """
    df = events_frame(events)
    fig, ax, owned = _axes(ax, (10, 4))
    _label(ax, title or "Retries per job", _TIME_LABEL, "job")
    att = attempts_frame(df)
    jobs = _pick_jobs(att, job_ids, max_jobs)
    att = att[att["job_id"].isin(jobs)]
    if att.empty:
        _no_events(ax)
        return _done(fig, ax, owned)
    t0, t_end = _span(df)
    lane = _lanes(ax, jobs)
    y = att["job_id"].map(lane).to_numpy()
    start = att["claimed_at"].to_numpy() - t0
    end = att["finished_at"].fillna(t_end).to_numpy() - t0
    _bars(ax, y, start, end - start, 0.6, "attempts",
          facecolors=[OUTCOME_COLORS[o] for o in att["outcome"]], edgecolors="none")
    gaps = att[att["waited_s"].notna()]
    waited = gaps["waited_s"].to_numpy()
    _bars(ax, gaps["job_id"].map(lane).to_numpy(), gaps["claimed_at"].to_numpy() - t0 - waited,
          waited, 0.3, "backoff", facecolors="0.92", edgecolors="0.55", hatch="///",
          linewidths=0.5)
    ax.set_xlim(left=0)
    extra: list[Any] = [Patch(facecolor="0.92", edgecolor="0.55", hatch="///",
                              label="wait before retry")]
    dead = df[(df["kind"] == ev.DEAD_LETTERED) & df["job_id"].isin(jobs)]
    if not dead.empty:
        ax.scatter(dead["t"] - t0, dead["job_id"].map(lane), marker="X", color="black",
                   s=60, zorder=3, gid="dead")
        extra.append(Line2D([], [], marker="X", color="black", linestyle="none",
                            label="dead-lettered"))
    ax.legend(handles=_outcome_handles(extra), title="attempt outcome", **_LEGEND)
    return _done(fig, ax, owned)


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


def _band_attempts(base: float, cap: float, observed_max: int) -> int:
    # Show the curve up to one attempt past where it reaches the cap, and every observed point.
    if base <= 0 or cap <= base:
        reach = 1
    else:
        reach = 1 + math.ceil(math.log2(cap / base))
    return max(observed_max, min(reach + 1, _MAX_BAND_ATTEMPTS), 3)


def backoff_curve(events: EventsLike, retry_backoff_s: float, retry_backoff_max_s: float,
                  retry_jitter: float, ax: Axes | None = None,
                  title: str | None = None) -> Figure:
    """Configured backoff policy against observed retry delays.

    x = the attempt number that failed, y = delay in seconds. The policy band (see
    :func:`backoff_band`) is a shaded ``fill_between`` (gid ``"backoff_band"``), the nominal
    curve a line (``"backoff_nominal"``), observed ``retry_scheduled`` delays > 0 filled dots
    (``"observed"``) and immediate retries (delay 0, e.g. after a lease expiry) hollow dots
    (``"observed_immediate"``). With no events the band is still drawn, with a note.
    """
    df = events_frame(events)
    fig, ax, owned = _axes(ax, (7, 4))
    _label(ax, title or "Retry backoff: policy vs observed", "failed attempt number",
           "retry delay (s)")
    retries = df[df["kind"] == ev.RETRY_SCHEDULED]
    observed_max = int(retries["attempt"].max()) if not retries.empty else 0
    x = np.arange(1, _band_attempts(retry_backoff_s, retry_backoff_max_s, observed_max) + 1)
    nominal, low, high = backoff_band(x, retry_backoff_s, retry_backoff_max_s, retry_jitter)
    ax.fill_between(x, low, high, color="tab:blue", alpha=0.2, gid="backoff_band",
                    label=f"policy band (jitter ±{retry_jitter:g})")
    ax.plot(x, nominal, "-", color="tab:blue", gid="backoff_nominal", label="policy nominal")
    delayed = retries[retries["delay_s"] > 0]
    immediate = retries[retries["delay_s"] == 0]
    if not delayed.empty:
        ax.scatter(delayed["attempt"], delayed["delay_s"], color="black", s=18, alpha=0.6,
                   zorder=3, gid="observed", label="observed delay")
    if not immediate.empty:
        ax.scatter(immediate["attempt"], immediate["delay_s"], facecolors="none",
                   edgecolors="tab:red", s=30, zorder=3, gid="observed_immediate",
                   label="immediate retry (delay 0)")
    if retries.empty:
        _no_events(ax, "no events (no retries observed)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(**_LEGEND)
    return _done(fig, ax, owned)


def depth_chart(events: EventsLike, ax: Axes | None = None,
                title: str | None = None) -> Figure:
    """Step lines of ready / leased / delayed / dead job counts over time (gid
    ``"depth_<state>"``), each held until the last event of the stream."""
    df = events_frame(events)
    fig, ax, owned = _axes(ax, (9, 3.5))
    _label(ax, title or "Queue depth", _TIME_LABEL, "jobs (count)")
    depth = depth_frame(df)
    if depth.empty:
        _no_events(ax)
        return _done(fig, ax, owned)
    t0, t_end = _span(df)
    x = np.append(depth["t"].to_numpy(), t_end) - t0
    for state, color in DEPTH_COLORS.items():
        y = depth[state].to_numpy()
        ax.step(x, np.append(y, y[-1]), where="post", color=color, label=state,
                gid=f"depth_{state}")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(title="state", **_LEGEND)
    return _done(fig, ax, owned)


def attempts_histogram(events: EventsLike, ax: Axes | None = None,
                       title: str | None = None) -> Figure:
    """Finished jobs by number of attempts, stacked: done (acked at least once, gid ``"done"``)
    below dead (dead-lettered, gid ``"dead"``). One bar of each per attempts count."""
    df = events_frame(events)
    fig, ax, owned = _axes(ax, (6, 3.5))
    _label(ax, title or "Attempts per finished job", "attempts (count)", "jobs (count)")
    jobs = jobs_frame(df)
    finished = jobs[jobs["finished_at"].notna()]
    if finished.empty:
        _no_events(ax, "no events (no finished jobs)")
        return _done(fig, ax, owned)
    lo, hi = min(1, int(finished["attempts"].min())), int(finished["attempts"].max())
    x = np.arange(lo, hi + 1)
    is_done = (finished["acks"] > 0).to_numpy()
    attempts = finished["attempts"].to_numpy() - lo
    done = np.bincount(attempts[is_done], minlength=len(x))
    dead = np.bincount(attempts[~is_done], minlength=len(x))
    ax.bar(x, done, color=FINISH_COLORS["done"], label="done", gid="done")
    ax.bar(x, dead, bottom=done, color=FINISH_COLORS["dead"], label="dead", gid="dead")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(**_LEGEND)
    return _done(fig, ax, owned)


def throughput_chart(events: EventsLike, bin_s: float = 1.0, ax: Axes | None = None,
                     title: str | None = None) -> Figure:
    """Events per second over time, per ``bin_s`` bin: acked, plus enqueued and the failure
    kinds (nacked, lease expired, dead-lettered) as stairs (gid ``"rate_<column>"``)."""
    df = events_frame(events)
    fig, ax, owned = _axes(ax, (9, 3.5))
    _label(ax, title or f"Throughput ({bin_s:g} s bins)", _TIME_LABEL,
           "events per second (1/s)")
    tp = throughput_frame(df, bin_s)
    if tp.empty:
        _no_events(ax)
        return _done(fig, ax, owned)
    t0, _ = _span(df)
    edges = np.append(tp["t"].to_numpy(), tp["t"].iloc[-1] + bin_s) - t0
    for column, (color, label) in _RATE_STYLE.items():
        ax.stairs(tp[column].to_numpy() / bin_s, edges, color=color, label=label,
                  gid=f"rate_{column}", linestyle="--" if column == "enqueued" else "-")
    ax.legend(**_LEGEND)
    return _done(fig, ax, owned)
