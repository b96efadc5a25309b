"""The owner's time series of its queue (``series`` op, read role): see
:mod:`istos.core.series` for what a bucket holds and what it costs.

One concept at three layers: the pure series is ``core/series.py``, the op serving it here,
its DataFrame shape in ``istos_nb/data/series.py``.

The owner's own counts end each bucket (copied once per event-loop turn that had events, not
per event), so the series' last row agrees with ``stats`` -- never a reconstruction from an
event window. Replies are paged by count and bytes like every other: ``more`` and
``next_since`` say where the next page starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from ... import protocol
from ...core import series as S
from ...events import JobEvent
from ..extension import Handler, OwnerExtension
from ..handle import OwnerHandle

RESOLUTIONS = {"1s": S.FINE_S, "1min": S.COARSE_S}
MAX_ROWS = 3600  # rows in one reply (and never more bytes than a page holds)


class SeriesKeeper(OwnerExtension):
    """Keeps :class:`~istos.core.series.Series` for one owner and serves ``series``."""

    name = "series"
    serves = ("series",)

    def __init__(self, owner: OwnerHandle) -> None:
        self.owner = owner
        self.series = S.Series(self._ready_at, owner.state.counts)
        self._mark_scheduled = False
        self._unsubscribe = owner.node.events.subscribe(self._on_event)

    def _ready_at(self, job_id: str) -> float | None:
        rec = self.owner.state.jobs.get(job_id)
        return None if rec is None else rec.ready_at

    def _on_event(self, event: JobEvent) -> None:
        if event.queue != self.owner.name:
            return
        self.series.observe(event)
        if not self._mark_scheduled:
            self._mark_scheduled = True
            asyncio.get_running_loop().call_soon(self._mark, event.t)

    def _mark(self, t: float) -> None:
        self._mark_scheduled = False
        self.series.mark_counts(max(t, self.owner.node.clock.now()), self.owner.state.counts)

    def on_stop(self) -> None:
        self._unsubscribe()

    def ops(self) -> Mapping[str, Handler]:
        return {"series": self.op_series}

    async def op_series(self, msg: dict[str, Any]) -> dict[str, Any]:
        now = self.owner.node.clock.now()
        resolution = RESOLUTIONS[msg.get("resolution") or "1s"]
        limit = min(MAX_ROWS, msg.get("limit", MAX_ROWS))
        self.series.mark_counts(now, self.owner.state.counts)  # the current bucket: as of now
        rows, more = protocol.page(self.series.rows(msg.get("since"), now, resolution),
                                   dict, limit)
        next_since = rows[-1]["t"] + resolution if more and rows else None
        return {"rows": rows, "more": more, "next_since": next_since,
                "resolution": msg.get("resolution") or "1s", "now": now}
