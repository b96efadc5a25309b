"""Shared plumbing of :mod:`istos_nb.views.charts`: colours, figure/axes handling, margins, bars.

Private: the public names are re-exported by ``istos_nb.views.charts``. Everything here uses the
object-oriented matplotlib API only (never pyplot's global state).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, Locator

from istos.errors import ConfigError
from istos_nb.views.glyphs import GLYPHS, Drawn

# One colour per meaning, the same in every chart (taken from the one vocabulary in glyphs.py).
OUTCOME_COLORS: dict[str, str] = {o: GLYPHS[o].color
                                  for o in ("acked", "nacked", "expired", "open", "cancelled")}
FINISH_COLORS: dict[str, str] = {"done": GLYPHS["acked"].color, "dead": GLYPHS["dead"].color}
DEPTH_COLORS: dict[str, str] = {s: GLYPHS[f"depth_{s}"].color
                                for s in ("ready", "leased", "delayed", "dead")}
# A thin dark outline on every bar: back-to-back leases of one colour stay countable, and
# unlike a white gap it never erases a bar only a pixel or two wide.
BAR_EDGE: dict[str, Any] = {"edgecolors": "0.1", "linewidths": 0.6}
TIME_LABEL = "time since first event (s)"
WALL_LABEL = "wall-clock time (UTC)"
LEGEND: dict[str, Any] = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0),
                          "fontsize": "small"}
MIN_BAR_PX = 2.0  # a bar narrower than this at the chart's own size is widened to it
_CHAR_IN = 0.085  # mean glyph width of the default 10 pt font, inches (for margin estimates)
# Epoch seconds after 2001-09-09: a live owner's wall clock. The simulator's virtual time starts
# at 0, so a stream whose first event is this late came from a real clock.
_WALL_CLOCK_FROM = 1e9
_CLOCK_STEPS = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200,
                10800, 21600, 43200, 86400)

Labels = Mapping[str, str] | Callable[[str], str] | None


def axes_for(ax: Axes | None, figsize: tuple[float, float]) -> tuple[Figure, Axes, bool]:
    """(figure, axes, owned): a new Figure when ``ax`` is None, else ``ax``'s root figure."""
    if ax is None:
        fig = Figure(figsize=figsize)
        return fig, fig.subplots(), True
    root: Any = ax.figure  # a Figure or a SubFigure
    # An Axes inside a SubFigure: hand back the root Figure, which is what callers display.
    while not isinstance(root, Figure) and getattr(root, "figure", root) is not root:
        root = root.figure
    return root, ax, False


def done(fig: Figure, ax: Axes, owned: bool) -> Figure:
    """Size the margins of a figure we created (a caller's own figure keeps its layout), then
    widen bars too thin to see at that size."""
    if owned:
        fit(fig, ax)
    floor_bar_widths(fig, ax)
    return fig


def legend(ax: Axes, drawn: Drawn, title: str | None = None, note: str = "") -> None:
    """The legend of what was drawn (nothing drawn: no legend), titled, with an optional note
    under the title (how many of how many are shown, when a chart aggregates)."""
    handles = drawn.handles()
    if not handles:
        return
    heading = "\n".join(t for t in (title, note) if t) or None
    ax.legend(handles=handles, title=heading, **LEGEND)


def floor_bar_widths(fig: Figure, ax: Axes) -> None:
    """Widen every bar narrower than :data:`MIN_BAR_PX` (at the figure's size and dpi) to that
    width, growing rightwards from its start: a 50 ms lease on a 10-minute axis is still there
    to see and count. Bars are the PolyCollections :func:`bars` made (gid set)."""
    lo, hi = ax.get_xlim()
    axes_px = ax.get_position().width * fig.get_figwidth() * fig.dpi
    if hi <= lo or axes_px <= 0:
        return
    min_w = MIN_BAR_PX * (hi - lo) / axes_px
    for coll in ax.collections:
        if not isinstance(coll, PolyCollection) or not getattr(coll, "istos_bars", False):
            continue
        for path in coll.get_paths():  # in place: the collection keeps its paths
            v: np.ndarray = np.asarray(path.vertices)  # a view: writes reach the path
            if v[2, 0] - v[0, 0] < min_w:
                v[2:4, 0] = v[0, 0] + min_w
        coll.stale = True


def resize(fig: Figure, width_in: float, height_in: float | None = None) -> Figure:
    """Set a one-axes chart's size and refit its margins (lanes keep their row height)."""
    fig.set_size_inches(width_in, height_in or fig.get_size_inches()[1])
    if len(fig.axes) == 1:
        fit(fig, fig.axes[0])
    return fig


def fit(fig: Figure, ax: Axes) -> None:
    """Margins from label lengths: room for lane names on the left, the legend on the right.

    Estimated instead of running a layout engine: constrained layout measures every text twice
    per draw, which doubled the dashboard's render time. ``tests/test_charts.py`` checks the
    result by measuring every rendered text against the axes.
    """
    # Tick label texts, not the formatter's ``seq``: matplotlib >= 3.10 wraps fixed labels in
    # a FuncFormatter that has no ``seq``, which left lane names cut off.
    fixed = ax.yaxis.get_major_formatter().__class__.__name__ in ("FixedFormatter",
                                                                   "FuncFormatter")
    lanes = [t.get_text() for t in ax.get_yticklabels() if t.get_text()] if fixed else []
    width, height = fig.get_size_inches()
    if lanes:  # one readable row per lane, within reason
        height = min(max(height, 1.3 + 0.28 * len(lanes)), 14.0)
        fig.set_size_inches(width, height)
    left = 0.75 + _CHAR_IN * max((len(str(s)) for s in lanes), default=5)
    right = 0.2
    legend = ax.get_legend()
    if legend is not None:  # every legend sits outside, right of the axes
        texts = [t.get_text() for t in legend.get_texts()]
        texts += legend.get_title().get_text().split("\n")
        right += 0.6 + 0.8 * _CHAR_IN * max(len(t) for t in texts)
    left_f, right_f = left / width, 1 - right / width
    if right_f - left_f < 0.2:  # a very narrow figure: keep the axes, lose some margin
        left_f, right_f = 0.1, 0.9
    fig.subplots_adjust(left=left_f, right=right_f, bottom=0.6 / height, top=1 - 0.4 / height)


def label(ax: Axes, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)


def no_events(ax: Axes, text: str = "no events") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4",
            gid="no_events")


Window = tuple[float, float] | None
"""(start, end) on the stream's clock (epoch seconds for a live owner): the time span a chart's
x axis shows exactly. The live dashboard gives every time chart the same one, ending at the
refresh instant; None: from the first to the last event."""


def span(df: pd.DataFrame, window: Window = None) -> tuple[float, float]:
    """(first, last) event time of the whole stream, or ``window``; charts subtract the first
    and hold open bars and counts until the second."""
    if window is not None:
        return check_window(window)
    return float(df["t"].min()), float(df["t"].max())


def check_window(window: tuple[float, float]) -> tuple[float, float]:
    """``window`` as two floats, start before end; ConfigError (a ValueError) naming it
    otherwise."""
    try:
        start, end = (float(v) for v in window)
    except (TypeError, ValueError):
        raise ConfigError(f"window must be (start, end) in seconds, got {window!r}") from None
    if not (math.isfinite(start) and math.isfinite(end) and start < end):
        raise ConfigError(f"window must be finite with start < end, got {window!r}")
    return start, end


def time_window(ax: Axes, window: Window) -> None:
    """With a ``window``: the x axis (seconds since its start) spans exactly it, on the clock
    axis :func:`time_axis` labels (so an empty chart shows the same span as the others)."""
    if window is None:
        return
    start, end = check_window(window)
    time_axis(ax, start)
    ax.set_xlim(0.0, end - start)


def is_wall_clock(t0: float) -> bool:
    """Did a stream starting at ``t0`` come from a real (epoch) clock, not virtual time?"""
    return t0 >= _WALL_CLOCK_FROM


class _ClockLocator(Locator):
    """Ticks at round wall-clock instants (every 1, 2, 5, 10, 15, 30 s, 1 min...) on an axis
    whose data is seconds since ``t0``."""

    def __init__(self, t0: float, max_ticks: int = 7) -> None:
        self.t0, self.max_ticks = t0, max_ticks

    def __call__(self) -> Any:
        lo, hi = self.axis.get_view_interval() if self.axis is not None else (0.0, 1.0)
        return self.tick_values(lo, hi)

    def tick_values(self, vmin: float, vmax: float) -> Any:
        lo, hi = sorted((vmin, vmax))
        span_s = max(hi - lo, 1e-9)
        step = next((s for s in _CLOCK_STEPS if span_s / s <= self.max_ticks),
                    _CLOCK_STEPS[-1])
        first = np.ceil((self.t0 + lo) / step) * step
        return np.arange(first, self.t0 + hi + step * 1e-6, step) - self.t0


def time_axis(ax: Axes, t0: float) -> None:
    """Label the x axis (seconds since ``t0``): relative seconds for a simulated stream, clock
    time (UTC) for a live one, ticks at round instants, so a reader can match the chart to
    logs and the owner's own timestamps."""
    if not is_wall_clock(t0):
        ax.set_xlabel(TIME_LABEL)
        return
    locator = _ClockLocator(t0)
    ax.xaxis.set_major_locator(locator)

    def clock(x: float, _pos: int | None = None) -> str:
        instant = datetime.fromtimestamp(t0 + x, tz=timezone.utc)
        ticks = locator()
        fine = len(ticks) > 1 and (ticks[1] - ticks[0]) < 1
        return instant.strftime("%H:%M:%S.%f")[:10] if fine else instant.strftime("%H:%M:%S")

    ax.xaxis.set_major_formatter(FuncFormatter(clock))
    ax.set_xlabel(WALL_LABEL)


def lanes(ax: Axes, names: Sequence[str], labels: Labels = None) -> dict[str, int]:
    """One lane per name, first on top; the tick text is ``labels`` applied to the name."""
    if labels is None:
        texts = list(names)
    elif callable(labels):
        texts = [str(labels(n)) for n in names]
    else:
        texts = [str(labels.get(n, n)) for n in names]
    ax.set_yticks(range(len(names)), labels=texts)
    ax.set_ylim(len(names) - 0.5, -0.5)  # first name on top, like a table
    return {name: i for i, name in enumerate(names)}


def short_ids(ids: Sequence[str], keep: int = 8) -> Labels:
    """Labels that cut long ids (generated hex ids are 24 characters) to their first ``keep``
    characters plus an ellipsis, when that keeps them apart; None (ids as they are) otherwise."""
    if not ids or all(len(i) <= keep + 4 for i in ids):
        return None
    cut = {i: (i[:keep] + "…" if len(i) > keep + 4 else i) for i in ids}
    return cut if len(set(cut.values())) == len(cut) else None


def bars(ax: Axes, y: np.ndarray, left: np.ndarray, width: np.ndarray, height: float,
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
    coll = PolyCollection(list(verts.reshape(-1, 4, 2)), gid=gid, **style)
    coll.istos_bars = True  # type: ignore[attr-defined]  # floor_bar_widths widens these
    ax.add_collection(coll)
    ax.autoscale_view()
    return coll


def step_bins(x: np.ndarray, y: np.ndarray, bins: int) -> tuple[np.ndarray, ...]:
    """Resample the step function ``y`` (held from each ``x`` to the next; ``x[-1]`` is the
    end) into ``bins`` equal bins: (edges, time-weighted mean, min, max) per bin.

    A series that changes many times per pixel drawn as steps paints a solid block; the mean
    as a line and the min..max range as a band show the same data at any zoom.
    """
    edges = np.linspace(x[0], x[-1], bins + 1)
    # The integral of a step function is piecewise linear, exact at every edge.
    held = y[:-1]
    cum = np.concatenate([[0.0], np.cumsum(held * np.diff(x))])
    k = np.clip(np.searchsorted(x, edges, side="right") - 1, 0, len(held) - 1)
    area = cum[k] + held[k] * (edges - x[k])
    width = np.diff(edges)
    mean = np.divide(np.diff(area), width, out=held[k[:-1]].astype(float), where=width > 0)
    first = k[:-1]
    last = np.clip(np.searchsorted(x, edges[1:], side="left") - 1, first, len(held) - 1)
    lo = np.array([held[a:b + 1].min() for a, b in zip(first, last)])
    hi = np.array([held[a:b + 1].max() for a, b in zip(first, last)])
    return edges, mean, lo, hi
