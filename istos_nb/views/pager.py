"""Previous / next paging for a dashboard table whose rows come from the owner a page at a time
(``LiveQueue.jobs(limit=, offset=)``).

DOM classes: ``istos-<name>-pager`` (the row), ``istos-<name>-prev`` and ``istos-<name>-next``
(its buttons, disabled at either end).
"""

from __future__ import annotations

from collections.abc import Callable

import ipywidgets as W

from istos.errors import ConfigError

__all__ = ["Pager"]


class Pager:
    """The offset of the page shown, moved by ``size`` rows per click; ``on_change()`` is called
    after each move (the dashboard refetches and redraws)."""

    def __init__(self, name: str, size: int, on_change: Callable[[], None]) -> None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ConfigError(f"page size must be a positive int, got {size!r}")
        self.size, self.offset = size, 0
        self._on_change = on_change
        self.prev = W.Button(description="◀ previous", disabled=True,
                             layout=W.Layout(width="auto"))
        self.next = W.Button(description="next ▶", disabled=True, layout=W.Layout(width="auto"))
        self.widget = W.HBox([self.prev, self.next])
        for widget, cls in ((self.widget, "pager"), (self.prev, "prev"), (self.next, "next")):
            widget.add_class(f"istos-{name}-{cls}")
        self.prev.on_click(lambda _b: self.move(-1))
        self.next.on_click(lambda _b: self.move(+1))

    def move(self, pages: int) -> None:
        """Go ``pages`` pages on (negative: back; never before the first row)."""
        offset = max(0, self.offset + pages * self.size)
        if offset != self.offset:
            self.offset = offset
            self._on_change()

    def reset(self) -> None:
        """Back to the first page (a new filter or search), without calling ``on_change``."""
        self.offset = 0

    def clamp(self, total: int | None) -> bool:
        """After rows left (the queue drained): move to the last page that still has rows.
        True when the offset changed (fetch again)."""
        if total is None or self.offset == 0 or self.offset < total:
            return False
        self.offset = max(0, (total - 1) // self.size * self.size)
        return True

    def shown(self, rows: int, total: int | None) -> None:
        """A page of ``rows`` was shown out of ``total`` (None: unknown): enable the buttons
        that lead somewhere."""
        self.prev.disabled = self.offset == 0
        self.next.disabled = rows < self.size if total is None else self.offset + rows >= total
