"""The live dashboard's dead letters tab: one row per dead letter with its own actions (show the
job; resubmit and purge, only with admin=True, each behind the dashboard's confirmation), a
page of :data:`DEAD_ROWS` at a time.

The row widgets are made once and refilled at each refresh (a refresh every 2 s must not create
and drop hundreds of widgets). DOM classes: ``istos-dead`` (the tab), ``istos-dead-note``
("1–20 of 31 dead letters"), ``istos-dead-row`` (one per dead letter shown, its job id in its
text), ``istos-dead-show`` / ``istos-dead-resubmit`` / ``istos-dead-purge`` (its buttons;
the Resubmit button keeps its old class ``istos-dead-requeue`` too, for one release), and
the pager's ``istos-dead-pager`` / ``istos-dead-prev`` / ``istos-dead-next``.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape as esc
from typing import Any

import ipywidgets as W
import pandas as pd

from . import livetables as lt
from .pager import Pager

__all__ = ["DEAD_ROWS", "DeadRows"]

DEAD_ROWS = 20
# One fixed-layout table per row, the same column widths in each: the rows line up like one
# table while each keeps its buttons next to it.
_WIDTHS = ("16em", "7.5em", "6em", "7em", "18em", "18em")
_CSS = ("<style>.istos-dead-cells table{table-layout:fixed;border-collapse:collapse;"
        "font-size:12px;width:72.5em}.istos-dead-cells td,.istos-dead-cells th{padding:2px 8px;"
        "text-align:left;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}</style>")
_COLS = "<colgroup>" + "".join(f'<col style="width:{w}">' for w in _WIDTHS) + "</colgroup>"


def _table(row: str) -> str:
    return f"<table>{_COLS}<tr>{row}</tr></table>"


class _Row:
    def __init__(self, on_show: Callable[[str], None],
                 on_action: Callable[[str, str], None]) -> None:
        self.job_id = ""
        self.cells = W.HTML()
        self.cells.add_class("istos-dead-cells")
        self.show = W.Button(description="Show", layout=W.Layout(width="auto"))
        self.resubmit = W.Button(description="Resubmit…", layout=W.Layout(width="auto"))
        self.purge = W.Button(description="Purge…", layout=W.Layout(width="auto"))
        self.widget = W.HBox([self.cells, self.show, self.resubmit, self.purge],
                             layout=W.Layout(display="none", align_items="center"))
        self.widget.add_class("istos-dead-row")
        for button, name in ((self.show, "show"), (self.resubmit, "resubmit"),
                             (self.resubmit, "requeue"), (self.purge, "purge")):
            button.add_class(f"istos-dead-{name}")
        self.show.on_click(lambda _b: self._on(lambda job: on_show(job)))
        self.resubmit.on_click(lambda _b: self._on(lambda job: on_action("resubmit", job)))
        self.purge.on_click(lambda _b: self._on(lambda job: on_action("purge", job)))

    def _on(self, act: Callable[[str], None]) -> None:
        if self.job_id:  # the row's job at the time of the click, not when it was built
            act(self.job_id)

    def fill(self, record: dict[str, Any] | None, now: pd.Timestamp, admin: bool) -> None:
        if record is None:
            self.job_id = ""
            self.widget.layout.display = "none"
            return
        self.job_id = str(record.get("job_id") or "")
        self.cells.value = _table("".join(lt.dead_cells(record, now)))
        admin_display = None if admin else "none"
        self.resubmit.layout.display = self.purge.layout.display = admin_display
        self.widget.layout.display = None


class DeadRows:
    """Dead letters, a page at a time, each row with Show (``on_show(job_id)``) and, when the
    owner says admin, Resubmit… and Purge… (``on_action("resubmit" | "purge", job_id)``: the
    dashboard asks for confirmation before anything is sent)."""

    def __init__(self, on_show: Callable[[str], None], on_action: Callable[[str, str], None],
                 on_page: Callable[[], None], rows: int = DEAD_ROWS,
                 hint: str = "Waiting for the first refresh.") -> None:
        self.pager = Pager("dead", rows, on_page)
        self.note = W.HTML(f"<p>{esc(hint)}</p>")
        self.note.add_class("istos-dead-note")
        header = W.HTML(_CSS + _table("".join(f"<th>{esc(h)}</th>" for h in lt.DEAD_HEADER)))
        header.add_class("istos-dead-cells")
        self.rows = [_Row(on_show, on_action) for _ in range(rows)]
        self.widget = W.VBox([W.HBox([self.note, self.pager.widget],
                                     layout=W.Layout(align_items="center")),
                              header, *(r.widget for r in self.rows)])
        self.widget.add_class("istos-dead")

    def show(self, dead: pd.DataFrame, now: pd.Timestamp, admin: bool) -> None:
        """Fill the rows with the current page of ``dead`` (all the dead letters, oldest
        first); a page past the end (letters were resubmitted, redriven or purged) moves back."""
        total = len(dead)
        self.pager.clamp(total)
        offset = self.pager.offset
        page = dead.iloc[offset:offset + self.pager.size].to_dict("records")
        self.note.value = f"<p>{esc(lt.page_note(len(page), total, 'dead letters', offset))}</p>"
        for i, row in enumerate(self.rows):
            row.fill(page[i] if i < len(page) else None, now, admin)
        self.pager.shown(len(page), total)

    def ids(self) -> list[str]:
        """The job ids of the rows shown, top to bottom."""
        return [r.job_id for r in self.rows if r.job_id]
