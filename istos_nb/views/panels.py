"""Rendering shared by both dashboards: chart images, HTML tables, the tab set, display, close.

Charts are PNG bytes in ``Image`` widgets and tables are ``HTML`` widgets (see
``istos_nb.views.widgets`` for why). DOM classes set here: ``istos-chart`` (chart images),
``istos-table`` and ``istos-table-<tab>`` (table panes), ``istos-hint`` (the line an empty
tab shows until its first render), ``istos-scroll`` (the box a table scrolls in).
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Mapping, Sequence
from html import escape as _esc
from typing import Any

import ipywidgets as W
import pandas as pd
from matplotlib.figure import Figure

from istos_nb.data.frames import events_frame
from istos_nb.views import charts

__all__ = ["CHART_DPI", "CHART_WIDTH_IN", "TABLE_ROWS", "Panels", "Shown", "close_tree",
           "figure_png", "table_html"]

TABLE_ROWS = 200  # a browser chokes on a multi-thousand-row HTML table; the frame has them all
_CHART_TABS = ("leases", "retries", "backoff", "depth")
_TABLE_CSS = ("<style>.istos-table table{border-collapse:collapse;font-size:12px}"
              ".istos-table th,.istos-table td{padding:2px 8px;text-align:right}"
              ".istos-table tr:nth-child(even){background:rgba(127,127,127,.08)}</style>")


CHART_WIDTH_IN = 12.0  # every chart at one width: at CHART_DPI a 1200 px image, shown 100% wide
CHART_DPI = 100


def figure_png(fig: Figure, dpi: int = CHART_DPI) -> bytes:
    """PNG bytes of ``fig`` (rendered with Agg; works in any thread, needs no display)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def table_html(df: pd.DataFrame, what: str, cap: int = TABLE_ROWS, intro: str = "") -> str:
    """``df`` as an HTML table of at most ``cap`` rows, under a line saying how many exist
    and, before that, ``intro`` (HTML the caller has escaped)."""
    note = f"{len(df)} {what}" + (f", first {cap} shown" if len(df) > cap else "")
    shown = df.head(cap)
    # na_rep covers NaN only; a None in a text column would print as "None"
    shown = shown.astype(object).where(shown.notna(), "")
    body = shown.to_html(index=False, border=0, float_format=lambda x: f"{x:.3f}")
    # The box scrolls both ways inside the pane: a wide table (the jobs table at 1440 px)
    # used to run past the page edge with its last columns cut off.
    return (f"{_TABLE_CSS}{intro}<p>{_esc(note)}</p>"
            f'<div class="istos-scroll" style="max-height:420px;max-width:100%;overflow:auto">'
            f"{body}</div>")


class Panels:
    """The tab set both dashboards show: four charts as PNG images (plus ``extra_charts``, which
    the caller draws), then HTML tables."""

    def __init__(self, tables: Sequence[str], hint: str = "Nothing to show yet.",
                 extra_charts: Sequence[str] = ()) -> None:
        # hidden until the first render: an Image with no bytes shows a broken-image icon
        # width 100 %: the image fills the pane (drawn at 1200 px, ~10 px text when shown
        # at that size) instead of sitting at its natural size in a corner.
        self.images = {name: W.Image(format="png", layout=W.Layout(
            width="100%", max_width="100%", height="auto", display="none"))
            for name in (*_CHART_TABS, *extra_charts)}
        self.tables = {name: W.HTML(layout=W.Layout(width="100%", max_width="100%",
                                                   overflow="auto")) for name in tables}
        # One hint per tab until its first render: an empty tab read as a broken page.
        self.hints = {name: W.HTML(f"<p style='color:#555;padding:1em 0'>{_esc(hint)}</p>")
                      for name in [*self.images, *self.tables]}
        for hint_widget in self.hints.values():
            hint_widget.add_class("istos-hint")
        for image in self.images.values():
            image.add_class("istos-chart")
        for name, pane in self.tables.items():
            pane.add_class("istos-table")
            pane.add_class("istos-table-" + name.replace(" ", "-"))
        self.panes = {name: W.VBox([self.hints[name], pane], layout=W.Layout(width="100%"))
                      for name, pane in {**self.images, **self.tables}.items()}
        self.tab = W.Tab(children=list(self.panes.values()), titles=list(self.panes))
        # Lazy drawing (show_charts(lazy=True)): the charts not on screen wait here, drawn
        # when their tab is selected; a newer show_charts replaces them (generation count).
        self._waiting: dict[str, Callable[[], Figure]] = {}
        self._generation = 0
        self._lock = threading.Lock()
        self.tab.observe(lambda _c: self._draw_selected(), names="selected_index")

    def show_charts(self, events: Any, backoff: tuple[float, float, float],
                    max_attempts: int | None = None,
                    after_each: Callable[[int], None] | None = None,
                    drawn_by: Mapping[str, Callable[[], Figure]] | None = None,
                    window: tuple[float, float] | None = None, lazy: bool = False) -> None:
        """Redraw the charts from ``events`` (anything ``events_frame`` accepts), each
        :data:`CHART_WIDTH_IN` wide at :data:`CHART_DPI`; ``after_each(n)`` is called after
        the n-th chart is shown, so a progress bar can follow the drawing too. The backoff
        band stops at ``max_attempts`` (the queue's). ``drawn_by`` maps a tab to a function
        drawing it instead of the events (a live owner's series: depth, throughput; every
        extra chart needs one); ``window`` is the time charts' one x span (see
        :data:`istos_nb.views.chartkit.Window`). With ``lazy`` only the chart of the selected
        tab is drawn now and each other one when its tab is selected (until the next call):
        a live page that shows one chart pays for one chart a refresh, not five."""
        events = events_frame(events)  # normalise once, not once per chart
        draws: dict[str, Callable[[Any], Any]] = {
            "leases": lambda e: charts.lease_gantt(e, window=window),
            "retries": lambda e: charts.retry_timeline(e, window=window),
            "backoff": lambda e: charts.backoff_curve(e, *backoff, max_attempts=max_attempts),
            "depth": lambda e: charts.depth_chart(e, window=window)}
        for name, own in (drawn_by or {}).items():
            if name not in self.images:
                raise ValueError(f"no chart tab {name!r} (tabs: {', '.join(self.images)})")
            draws[name] = _ignoring_events(own)
        missing = [name for name in self.images if name not in draws]
        if missing:
            raise ValueError(f"no drawing for chart tab(s) {', '.join(missing)}: pass drawn_by")
        if lazy:
            with self._lock:
                self._generation += 1
                self._waiting = {name: _bound(draws[name], events) for name in self.images}
            self._draw_selected()
            return
        for n, name in enumerate(self.images, 1):
            self._put(name, draws[name](events))
            if after_each is not None:
                after_each(n)

    @property
    def selected(self) -> str | None:
        """The title of the selected tab (None when none is)."""
        index, titles = self.tab.selected_index, list(self.tab.titles)
        return titles[index] if index is not None and 0 <= index < len(titles) else None

    def _draw_selected(self) -> None:
        """Draw the selected tab's chart if it waits (lazy mode); a failure shows in its hint."""
        name = self.selected
        with self._lock:
            draw = self._waiting.pop(name, None) if name is not None else None
            generation = self._generation
        if draw is None or name is None:
            return
        try:
            fig = draw()
        except Exception as exc:  # noqa: BLE001 - shown in the tab; the next refresh retries
            self.hints[name].value = _esc(f"could not draw {name}: {type(exc).__name__}: {exc}")
            self.hints[name].layout.display = None
            return
        with self._lock:
            if generation != self._generation:
                return  # a newer refresh has its own drawing of this tab waiting or done
        self._put(name, fig)

    def _put(self, name: str, fig: Figure) -> None:
        self.images[name].value = figure_png(charts.resize(fig, CHART_WIDTH_IN))
        self.images[name].layout.display = None
        self.hide_hint(name)

    def show_table(self, name: str, df: pd.DataFrame, what: str, intro: str = "") -> None:
        self.tables[name].value = table_html(df, what, intro=intro)
        self.hide_hint(name)

    def hide_hint(self, name: str) -> None:
        """The tab ``name`` has content now: drop its "nothing yet" line."""
        self.hints[name].layout.display = "none"


def _bound(draw: Callable[[Any], Figure], events: Any) -> Callable[[], Figure]:
    return lambda: draw(events)


def _ignoring_events(draw: Callable[[], Figure]) -> Callable[[Any], Figure]:
    return lambda _events: draw()


def close_tree(widget: W.Widget) -> None:
    # Widget.close() closes one widget; children and layouts would linger in the kernel.
    for child in getattr(widget, "children", ()):
        close_tree(child)
    widget.close()


class Shown:
    """Displays as its top-level ``widget`` in every frontend (the mimebundle protocol)."""

    widget: W.Box

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def close(self) -> None:
        """Close every widget of the dashboard (the kernel forgets them)."""
        close_tree(self.widget)

