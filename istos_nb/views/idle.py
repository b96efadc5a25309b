"""When a live dashboard's timer refresh may do (almost) nothing: the owner's stats say nothing
happened since the last full refresh, and that one is recent.

An open page nobody touches refreshes every 2 s; fetching the jobs, dead letters, events,
series and workers, rebuilding their tables and drawing five charts cost ~1 s of CPU each
time (~46% of a core) for a queue where nothing moved. The stats are one small request; when
they are what they were (leaving out what only says how long ago something was), the rest
would show the same, bar the "... ago" ages and the time charts' span ending at now, which a
full refresh every :data:`FULL_EVERY_S` brings up to date.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

__all__ = ["FULL_EVERY_S", "IdleCheck"]

FULL_EVERY_S = 60.0
_AGES = ("oldest_ready_age_s",)  # change with the clock alone


class IdleCheck:
    """Remembers the stats of the last full refresh (:meth:`refreshed`) and says whether a
    timer's refresh with these stats may be skipped (:meth:`quiet`)."""

    def __init__(self, full_every_s: float = FULL_EVERY_S) -> None:
        self.full_every_s = full_every_s
        self._last: tuple[dict[str, Any], float] | None = None

    def quiet(self, stats: Mapping[str, Any]) -> bool:
        return self._last is not None and self._last[0] == _moved(stats) \
            and time.monotonic() - self._last[1] < self.full_every_s

    def refreshed(self, stats: Mapping[str, Any]) -> None:
        self._last = (_moved(stats), time.monotonic())


def _moved(stats: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in stats.items() if k not in _AGES}
