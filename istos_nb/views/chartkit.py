"""Shared plumbing of :mod:`istos_nb.views.charts`: colours, figure/axes handling, margins, bars.

Private: the public names are re-exported by ``istos_nb.views.charts``. Everything here uses the
object-oriented matplotlib API only (never pyplot's global state).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Patch

# One colour per meaning, the same in every chart, so a glance transfers between them.
OUTCOME_COLORS: dict[str, str] = {
    "acked": "tab:green", "nacked": "tab:orange", "expired": "tab:red", "open": "tab:gray",
    "cancelled": "tab:brown",
}
FINISH_COLORS: dict[str, str] = {"done": "tab:green", "dead": "tab:red"}
DEPTH_COLORS: dict[str, str] = {
    "ready": "tab:blue", "leased": "tab:purple", "delayed": "tab:olive", "dead": "tab:red",
}
# A thin dark outline on every bar: back-to-back leases of one colour stay countable, and
# unlike a white gap it never erases a bar only a pixel or two wide.
BAR_EDGE: dict[str, Any] = {"edgecolors": "0.1", "linewidths": 0.6}
# Node markers readable on any bar colour: a black cross ringed in white for a crash, a white
# triangle ringed in black for a restart.
CRASH_STYLE: dict[str, Any] = {"marker": "X", "color": "black", "edgecolors": "white",
                               "linewidths": 1.2, "s": 120}
RESTART_STYLE: dict[str, Any] = {"marker": ">", "color": "white", "edgecolors": "black",
                                 "linewidths": 1.2, "s": 90}
TIME_LABEL = "time since first event (s)"
LEGEND: dict[str, Any] = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0),
                          "fontsize": "small"}
_CHAR_IN = 0.085  # mean glyph width of the default 10 pt font, inches (for margin estimates)

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
    """Size the margins of a figure we created; a caller's own figure keeps its layout."""
    if owned:
        fit(fig, ax)
    return fig


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
        texts = [t.get_text() for t in legend.get_texts()] + [legend.get_title().get_text()]
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


def span(df: pd.DataFrame) -> tuple[float, float]:
    """(first, last) event time of the whole stream; charts subtract the first."""
    return float(df["t"].min()), float(df["t"].max())


def outcome_handles(extra: Sequence[Any] = ()) -> list[Any]:
    return [Patch(facecolor=c, edgecolor=BAR_EDGE["edgecolors"], label=o)
            for o, c in OUTCOME_COLORS.items()] + list(extra)


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
