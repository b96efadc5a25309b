"""Wait-time and run-time distributions of one owner, from its own events (the owner's truth).

*Wait* is how long a job was claimable before a worker claimed it (claim time minus the time it
became ready: enqueue plus delay, or the retry time); *run* is how long a delivery was held
(claim to ack, nack or lease expiry: it includes the round trips and a prefetched job's wait in
the worker). Both go into cumulative histograms since the owner started, with the fixed
``BUCKETS_S`` upper bounds (seconds; Prometheus ``le`` labels; the last is +Inf), and into a
window of the last ``WINDOW_S`` seconds for p50/p95/p99 (at most ``MAX_SAMPLES`` samples each;
beyond that the oldest go first, and ``n`` says how many the percentiles stand on).

Installed as an owner extension that adds ``wait_s``, ``run_s`` (``{p50, p95, p99, n}``, None
values when no sample), ``wait_hist``, ``run_hist`` (``{le, counts, sum, count}``) and
``workers_seen`` to the ``stats`` reply.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable
from typing import Any

from ... import events as ev
from ...events import JobEvent
from ..extension import Handler, OwnerExtension, not_wrapped
from ..handle import OwnerHandle

BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
             900.0, 3600.0)
WINDOW_S = 60.0
MAX_SAMPLES = 20_000
MAX_OPEN = 200_000  # claimed deliveries whose end is awaited (more: the oldest are dropped)
_ENDS = (ev.ACKED, ev.NACKED, ev.LEASE_EXPIRED, ev.CANCELLED)


class Distribution:
    """One cumulative histogram plus a sliding window of samples."""

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS_S) + 1)  # per bucket (not cumulative), +Inf last
        self.sum = 0.0
        self.window: deque[tuple[float, float]] = deque(maxlen=MAX_SAMPLES)

    def add(self, t: float, seconds: float) -> None:
        seconds = max(0.0, seconds)  # clocks of claim and ready are the owner's: no skew
        self.counts[bisect.bisect_left(BUCKETS_S, seconds)] += 1
        self.sum += seconds
        self.window.append((t, seconds))

    def histogram(self) -> dict[str, Any]:
        cumulative, running = [], 0
        for n in self.counts:
            running += n
            cumulative.append(running)
        return {"le": [*BUCKETS_S, "+Inf"], "counts": cumulative, "sum": self.sum,
                "count": running}

    def percentiles(self, now: float) -> dict[str, float | int | None]:
        window = self.window
        while window and window[0][0] < now - WINDOW_S:
            window.popleft()
        values = sorted(s for _, s in window)
        if not values:
            return {"p50": None, "p95": None, "p99": None, "n": 0}
        return {"p50": _quantile(values, 0.50), "p95": _quantile(values, 0.95),
                "p99": _quantile(values, 0.99), "n": len(values)}


def _quantile(values: list[float], q: float) -> float:
    """The nearest-rank quantile of sorted ``values``."""
    rank = math.ceil(round(q * len(values), 9))  # round: 0.95 * 20 is 19.000000000000004
    return values[min(len(values), max(1, rank)) - 1]


class Latency(OwnerExtension):
    """Wait and run distributions of one owner, served in its ``stats`` (which it wraps)."""

    name = "latency"
    wraps = ("stats",)

    def __init__(self, owner: OwnerHandle, workers_seen: Callable[[], int] | None = None
                 ) -> None:
        self.owner = owner
        self.wait, self.run = Distribution(), Distribution()
        self._claimed: dict[str, float] = {}
        self._workers_seen = workers_seen
        self._stats: Handler = not_wrapped
        self._unsubscribe = owner.node.events.subscribe(self._on_event)

    def wrap(self, op: str, inner: Handler) -> Handler:
        self._stats = inner
        return self._op_stats

    def on_stop(self) -> None:
        self._unsubscribe()

    def _on_event(self, event: JobEvent) -> None:
        if event.queue != self.owner.name or not event.job_id:
            return
        if event.kind == ev.CLAIMED:
            rec = self.owner.state.jobs.get(event.job_id)
            if rec is not None:
                self.wait.add(event.t, event.t - rec.ready_at)
            if len(self._claimed) >= MAX_OPEN:
                del self._claimed[next(iter(self._claimed))]
            self._claimed[event.job_id] = event.t
        elif event.kind in _ENDS:
            start = self._claimed.pop(event.job_id, None)
            if start is not None:
                self.run.add(event.t, event.t - start)

    async def _op_stats(self, msg: dict[str, Any]) -> dict[str, Any]:
        reply = await self._stats(msg)
        now = self.owner.node.clock.now()
        reply["stats"].update(
            wait_s=self.wait.percentiles(now), run_s=self.run.percentiles(now),
            wait_hist=self.wait.histogram(), run_hist=self.run.histogram())
        if self._workers_seen is not None:
            reply["stats"]["workers_seen"] = self._workers_seen()
        return reply
