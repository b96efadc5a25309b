"""``istos metrics``: Prometheus text exposition of live queues on ``/metrics`` (read-only).

One concept at two layers: the exporter here; the outbox's gauges it adds with ``--outbox``
are ``outbox/metrics.py``.

Each scrape asks every queue's owner for its ``stats`` at once, each within its own budget
(``--budget``, default :data:`SCRAPE_BUDGET_S`), so an unreachable queue costs a scrape that
budget and never delays or hides the others, and reports, with a ``queue`` label:

- ``istos_owner_up`` 1 when the owner answered this scrape, 0 otherwise (then nothing else
  for it);
- ``istos_jobs{state=...}`` jobs the owner holds per state (every state, cancelled included);
- ``istos_enqueued_total``, ``istos_acked_total``, ``istos_nacked_total``,
  ``istos_dead_lettered_total``, ``istos_lease_expired_total``, ``istos_expired_total`` (jobs
  whose start deadline passed before they started): counts since the owner started
  (a new owner starts again from 0, which Prometheus' ``rate()`` treats as a counter reset);
- ``istos_oldest_ready_age_seconds`` how long the oldest ready job has waited (0 when none);
- ``istos_paused`` 1 while claiming is paused; ``istos_pause_info{by,reason}`` 1 while it is,
  labelled with who paused it and why; ``istos_paused_groups`` fairness groups paused;
- ``istos_throttled_total`` claim slots the queue's rate limit refused while jobs were ready
  (0 for a queue without a limit);
- wait/run histograms, ``istos_workers`` and per-worker counters: see ``metrics_ops.py``.

It never claims and sends nothing but ``stats``. Needs ``prometheus-client`` (the ``metrics``
extra: ``pip install 'istos-nb[metrics]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from collections.abc import Iterator, Sequence
from typing import Any

from ..cancel_guard import within
from ..errors import ConfigError, IstosError
from .metrics_ops import WORKERS_KEY, families, with_workers
from .operator import Operator
from .pause_view import add_pause_metrics, pause_families

TOTALS = ("enqueued", "acked", "nacked", "dead_lettered", "lease_expired", "expired")
SCRAPE_BUDGET_S = 0.3  # per queue: a scrape with a dead queue stays well under half a second


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise ConfigError("istos metrics needs prometheus-client: "
                          "pip install 'istos-nb[metrics]'") from exc
    return prometheus_client


class QueueCollector:
    """A prometheus-client collector over ``op`` (whose session lives on ``loop``)."""

    def __init__(self, op: Operator, queues: Sequence[str], loop: asyncio.AbstractEventLoop,
                 timeout_s: float) -> None:
        self.op, self.queues, self.loop, self.timeout_s = op, list(queues), loop, timeout_s

    async def _gather(self) -> dict[str, dict[str, Any] | None]:
        async def one(queue: str) -> dict[str, Any] | None:
            try:  # each queue within its own budget: a dead one never delays the others
                stats = await within(self.op.stats(queue), self.timeout_s)
            except (IstosError, asyncio.TimeoutError):
                return None
            try:
                return await within(with_workers(self.op, queue, stats), self.timeout_s)
            except asyncio.TimeoutError:
                return {**stats, WORKERS_KEY: None}

        queues = self.queues or list(await self.op.discover())  # none named: all, each time
        answers = await asyncio.gather(*(one(q) for q in queues))
        return dict(zip(queues, answers))

    def describe(self) -> list[Any]:
        # Without this, registering would call collect() on the loop's own thread: a deadlock.
        return []

    def collect(self) -> Iterator[Any]:
        """Called by prometheus-client in its HTTP thread, once per scrape."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        fut = asyncio.run_coroutine_threadsafe(self._gather(), self.loop)
        # Each queue's own budget bounds its stats and workers; discovery has the rest.
        stats = fut.result(2 * self.timeout_s + 30)
        up = GaugeMetricFamily("istos_owner_up", "1 when the queue's owner answered this scrape",
                               labels=["queue"])
        jobs = GaugeMetricFamily("istos_jobs", "Jobs the owner holds, by state",
                                 labels=["queue", "state"])
        totals = {k: CounterMetricFamily(f"istos_{k}", f"Jobs {k.replace('_', ' ')} since the "
                                         "owner started", labels=["queue"]) for k in TOTALS}
        oldest = GaugeMetricFamily("istos_oldest_ready_age_seconds",
                                   "Seconds the oldest ready job has waited", labels=["queue"])
        paused = GaugeMetricFamily("istos_paused", "1 while claiming is paused",
                                   labels=["queue"])
        pause_info, paused_groups = pause_families(GaugeMetricFamily)
        throttled = CounterMetricFamily(
            "istos_throttled", "Claim slots the queue's rate limit refused while jobs were "
            "ready, since the owner started", labels=["queue"])
        for queue, s in stats.items():
            up.add_metric([queue], 0.0 if s is None else 1.0)
            if s is None:
                continue
            for state, n in (s.get("counts") or {}).items():
                jobs.add_metric([queue, state], float(n))
            for kind, family in totals.items():
                family.add_metric([queue], float((s.get("totals") or {}).get(kind, 0)))
            oldest.add_metric([queue], float(s.get("oldest_ready_age_s") or 0.0))
            paused.add_metric([queue], 1.0 if s.get("paused") else 0.0)
            add_pause_metrics(queue, s, pause_info, paused_groups)
            throttled.add_metric([queue], float((s.get("rate_limit") or {}).get("throttled", 0)))
        yield from (up, jobs, *totals.values(), oldest, paused, pause_info, paused_groups,
                    throttled)
        yield from families(stats)  # histograms and workers (metrics_ops.py)


async def serve_metrics(args: argparse.Namespace, out: Any) -> int:
    """Serve until SIGINT/SIGTERM; returns the exit status (0)."""
    prom = _prometheus()
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port must be 1..65535, got {args.port}")
    budget = SCRAPE_BUDGET_S if args.budget is None else args.budget
    if not 0 < budget <= 60:
        raise ConfigError(f"--budget must be > 0 and <= 60 seconds, got {budget}")
    async with Operator(args.zenoh, prefix=args.prefix, timeout_s=args.timeout) as op:
        loop = asyncio.get_running_loop()
        registry = prom.CollectorRegistry()
        registry.register(QueueCollector(op, list(dict.fromkeys(args.queue)), loop, budget))
        outbox = await _outbox_collector(args, loop, registry)
        try:
            server, thread = prom.start_http_server(args.port, addr=args.host, registry=registry)
        except OSError as exc:
            raise ConfigError(f"cannot listen on {args.host}:{args.port}: {exc}") from exc
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        out.write(f"serving metrics of {', '.join(args.queue) or 'every queue discovered'} on "
                  f"http://{args.host}:{args.port}/metrics\n")
        out.flush()
        try:
            await stop.wait()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            await asyncio.to_thread(server.shutdown)
            thread.join(5)
            if outbox is not None:
                await outbox.close()
    return 0


async def _outbox_collector(args: argparse.Namespace, loop: asyncio.AbstractEventLoop,
                            registry: Any) -> Any:
    """With ``--outbox URL``: register the outbox's gauges; returns its store (to close)."""
    if getattr(args, "outbox", None) is None:
        return None
    from ..outbox.metrics import OutboxCollector
    from ..outbox.sql import SQLOutboxStore

    store = SQLOutboxStore(args.outbox, args.outbox_table)
    await store.open()
    registry.register(OutboxCollector(store, args.outbox_table, loop))
    return store
