"""Prometheus gauges of an outbox table (``istos metrics --outbox URL``), read from the
database at each scrape, within a budget, so a database that does not answer costs the scrape
that long and reports ``istos_outbox_up 0``:

One concept at two layers: the outbox's gauges here; the exporter that serves them is
``ops/metrics.py``.

- ``istos_outbox_up`` 1 when the database answered this scrape;
- ``istos_outbox_depth`` rows waiting (claimed ones included);
- ``istos_outbox_claimed`` rows a relay holds right now;
- ``istos_outbox_oldest_age_seconds`` how long the oldest row has waited (0 when none).

A depth and an oldest age that keep growing mean no relay runs, or no owner answers it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

from ..cancel_guard import within
from ..clock import SystemClock
from ..errors import IstosError
from .store import OutboxStore


class OutboxCollector:
    """A prometheus-client collector over ``store`` (opened, on ``loop``), labelled
    ``table``; each scrape waits at most ``budget_s`` for the database."""

    def __init__(self, store: OutboxStore, table: str, loop: asyncio.AbstractEventLoop,
                 budget_s: float = 1.0) -> None:
        self.store, self.table, self.loop, self.budget_s = store, table, loop, budget_s
        self._clock = SystemClock()

    async def _read(self) -> dict[str, Any] | None:
        try:
            return await within(self.store.stats(self._clock.now()), self.budget_s)
        except (IstosError, asyncio.TimeoutError):
            return None

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        fut = asyncio.run_coroutine_threadsafe(self._read(), self.loop)
        stats = fut.result(self.budget_s + 30)
        families = {
            "up": GaugeMetricFamily("istos_outbox_up", "1 when the outbox's database "
                                    "answered this scrape", labels=["table"]),
            "depth": GaugeMetricFamily("istos_outbox_depth", "Outbox rows waiting (claimed "
                                       "ones included)", labels=["table"]),
            "claimed": GaugeMetricFamily("istos_outbox_claimed", "Outbox rows a relay holds",
                                         labels=["table"]),
            "oldest_age_s": GaugeMetricFamily("istos_outbox_oldest_age_seconds", "Seconds "
                                              "the oldest outbox row has waited",
                                              labels=["table"]),
        }
        families["up"].add_metric([self.table], 0.0 if stats is None else 1.0)
        if stats is not None:
            for key in ("depth", "claimed", "oldest_age_s"):
                families[key].add_metric([self.table], float(stats[key] or 0.0))
        yield from families.values()
