"""Charts of a queue's series (``LiveQueue.series()`` or ``SimResult.series()``: one frame, so
one function draws both worlds), against wall-clock time.

Unlike the event-window charts, these draw the owner's own counts: with any backlog the depth
is what ``stats()`` says, not a reconstruction from the last thousand events.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from istos_nb.views.chartkit import DEPTH_COLORS, LEGEND, axes_for, done, label, no_events

__all__ = ["series_depth_chart", "series_throughput_chart"]

_RATES = {"acked": "#2ca02c", "enqueued": "#1f77b4", "nacked": "#ff7f0e",
          "expired": "#9467bd", "dead_lettered": "#d62728"}


def _wall_axis(ax: Axes) -> None:
    locator = AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))


def series_depth_chart(series: pd.DataFrame, ax: Axes | None = None,
                       title: str | None = None) -> Figure:
    """Ready / leased / delayed / dead jobs at each bucket's end (gid ``"series_<state>"``),
    up to the last bucket (now, for a live owner), on a UTC wall-clock axis."""
    fig, ax, owned = axes_for(ax, (9, 3.5))
    label(ax, title or "Queue depth (the owner's counts)", "time (UTC)", "jobs (count)")
    if series.empty:
        no_events(ax, "no series yet")
        return done(fig, ax, owned)
    x = series.index.tz_convert("UTC").tz_localize(None)
    for state, color in DEPTH_COLORS.items():
        if state in series.columns:
            ax.step(x, series[state].to_numpy(), where="post", color=color, label=state,
                    gid=f"series_{state}")
    _wall_axis(ax)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    ax.legend(title="state", **LEGEND)
    return done(fig, ax, owned)


def series_throughput_chart(series: pd.DataFrame, ax: Axes | None = None,
                            title: str | None = None) -> Figure:
    """Events per second in each bucket (gid ``"series_rate_<column>"``), wall-clock axis."""
    fig, ax, owned = axes_for(ax, (9, 3.5))
    label(ax, title or "Throughput (the owner's counts)", "time (UTC)",
          "events per second (1/s)")
    if series.empty:
        no_events(ax, "no series yet")
        return done(fig, ax, owned)
    x = series.index.tz_convert("UTC").tz_localize(None)
    width = (x[1] - x[0]).total_seconds() if len(x) > 1 else 1.0
    for column, color in _RATES.items():
        ax.step(x, series[column].to_numpy() / width, where="post", color=color, label=column,
                gid=f"series_rate_{column}", linestyle="--" if column == "enqueued" else "-")
    _wall_axis(ax)
    ax.set_ylim(bottom=0)
    ax.legend(**LEGEND)
    return done(fig, ax, owned)
