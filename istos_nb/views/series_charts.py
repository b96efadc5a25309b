"""Charts of a queue's series (``LiveQueue.series()`` or ``SimResult.series()``: one frame, so
one function draws both worlds), against wall-clock time (UTC, ``HH:MM:SS`` ticks).

Unlike the event-window charts, these draw the owner's own counts: with any backlog the depth
is what ``stats()`` says, not a reconstruction from the last thousand events. ``window=(start,
end)`` in epoch seconds fixes the x span (the live dashboard: the span its event charts show,
ending at the refresh instant); the last bucket's counts are then held until its end.
"""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.dates import AutoDateLocator, DateFormatter, date2num
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from istos_nb.views.chartkit import (
    DEPTH_COLORS,
    LEGEND,
    WALL_LABEL,
    Window,
    axes_for,
    check_window,
    done,
    label,
    no_events,
)

__all__ = ["depth_caption", "series_depth_chart", "series_throughput_chart"]

_RATES = {"acked": "#2ca02c", "enqueued": "#1f77b4", "nacked": "#ff7f0e",
          "expired": "#9467bd", "dead_lettered": "#d62728"}


def _naive_utc(epoch_s: float) -> datetime:
    return datetime.fromtimestamp(epoch_s, tz=timezone.utc).replace(tzinfo=None)


def _wall_axis(ax: Axes, window: Window) -> None:
    """UTC clock ticks (``HH:MM:SS``, like the event charts' live axis) over ``window``."""
    ax.xaxis.set_major_locator(AutoDateLocator(minticks=3, maxticks=8))
    ax.xaxis.set_major_formatter(DateFormatter("%H:%M:%S"))
    ax.set_xlabel(WALL_LABEL)
    if window is not None:
        start, end = check_window(window)
        ax.set_xlim(date2num(_naive_utc(start)), date2num(_naive_utc(end)))


def _x(series: pd.DataFrame, window: Window) -> tuple[pd.DatetimeIndex, bool]:
    """The buckets' starts as naive UTC datetimes, plus the window's end when it is later
    than the last bucket (so the last counts are held until "now")."""
    x = series.index.tz_convert("UTC").tz_localize(None)
    if window is None:
        return x, False
    end = pd.Timestamp(_naive_utc(check_window(window)[1]))
    return (x.append(pd.DatetimeIndex([end])), True) if end > x[-1] else (x, False)


def series_depth_chart(series: pd.DataFrame, ax: Axes | None = None,
                       title: str | None = None, window: Window = None) -> Figure:
    """Ready / leased / delayed / dead jobs at each bucket's end (gid ``"series_<state>"``),
    up to the last bucket (now, for a live owner; with ``window``, until its end), on a UTC
    wall-clock axis."""
    fig, ax, owned = axes_for(ax, (9, 3.5))
    label(ax, title or "Queue depth (the owner's counts)", WALL_LABEL, "jobs (count)")
    if series.empty:
        no_events(ax, "no series yet")
        _wall_axis(ax, window)
        return done(fig, ax, owned)
    x, held = _x(series, window)
    for state, color in DEPTH_COLORS.items():
        if state in series.columns:
            y = series[state].to_numpy()
            ax.step(x, np.append(y, y[-1]) if held else y, where="post", color=color,
                    label=state, gid=f"series_{state}")
    _wall_axis(ax, window)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=0)
    ax.legend(title="state", **LEGEND)
    return done(fig, ax, owned)


def series_throughput_chart(series: pd.DataFrame, ax: Axes | None = None,
                            title: str | None = None, window: Window = None) -> Figure:
    """Events per second in each bucket (gid ``"series_rate_<column>"``), wall-clock axis;
    ``window`` as in :func:`series_depth_chart`."""
    fig, ax, owned = axes_for(ax, (9, 3.5))
    label(ax, title or "Throughput (the owner's counts)", WALL_LABEL,
          "events per second (1/s)")
    if series.empty:
        no_events(ax, "no series yet")
        _wall_axis(ax, window)
        return done(fig, ax, owned)
    x, held = _x(series, window)
    width = (x[1] - x[0]).total_seconds() if len(series) > 1 else 1.0
    for column, color in _RATES.items():
        y = series[column].to_numpy() / width
        ax.step(x, np.append(y, y[-1]) if held else y, where="post", color=color,
                label=column, gid=f"series_rate_{column}",
                linestyle="--" if column == "enqueued" else "-")
    _wall_axis(ax, window)
    ax.set_ylim(bottom=0)
    ax.legend(**LEGEND)
    return done(fig, ax, owned)


def depth_caption(series: pd.DataFrame | None) -> str:
    """One line under a live depth chart: the owner's counts in its newest bucket, exact (a
    chart's step is hard to read to the job), or why the chart draws the event window."""
    if series is None:
        return "depth from the event window: this owner keeps no series"
    if series.empty:
        return "the owner's series has no bucket yet"
    last = series.iloc[-1]
    at = pd.Timestamp(series.index[-1])
    at = at.tz_localize("UTC") if at.tzinfo is None else at.tz_convert("UTC")
    counts = " · ".join(f"{state} {int(last[state])}" for state in DEPTH_COLORS
                        if state in series.columns)
    return f"the owner's counts at {at.strftime('%H:%M:%S')} UTC: {counts}"
