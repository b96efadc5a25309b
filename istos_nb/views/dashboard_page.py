"""The page ``istos dashboard`` serves: one queue's dashboard, or the overview of every queue
(``?queue=`` and ``?job=`` in its URL pick a queue and open a job)."""

from __future__ import annotations

import urllib.parse
from html import escape as esc
from typing import Any

import ipywidgets as W

from ..live.attach import attach
from ..live.overview import queues
from .live_dashboard import LiveDashboard
from .opviews import overview_html

__all__ = ["page"]


def page(queue: str | None, zenoh: Any, prefix: str, timeout_s: float, query: str) -> Any:
    """What ``istos dashboard`` shows: ``?queue=`` (or ``queue``) picks the queue's dashboard,
    ``?job=`` opens that job's detail in it; with no queue, the overview of every queue."""
    params = urllib.parse.parse_qs(query or "")
    queue = (params.get("queue") or [queue or ""])[0] or None
    if queue is not None:
        lq = attach(queue, zenoh, prefix=prefix, timeout_s=timeout_s)
        # The page's own timer drives refreshes: a closed page's kernel goes quiet and is culled.
        dash = LiveDashboard(lq, refresh_s=2.0, page_timer=True)
        job = (params.get("job") or [""])[0]
        if job:
            dash.open_job(job)
        return dash
    table = W.HTML()
    table.add_class("istos-overview-page")
    button = W.Button(description="Refresh", icon="refresh")

    def refresh(_b: Any = None) -> None:
        try:
            table.value = overview_html(queues(zenoh, prefix=prefix, timeout_s=timeout_s))
        except Exception as exc:  # noqa: BLE001 - shown; the next refresh retries
            table.value = f"<p>error: {esc(type(exc).__name__)}: {esc(str(exc))}</p>"

    button.on_click(refresh)
    refresh()
    return W.VBox([W.HTML(f"<h3>queues under {esc(prefix)}</h3>"), button, table])
