"""The metric families that ``istos metrics`` adds to each scrape, from the owner's
own numbers (its ``stats`` and its ``workers`` table):

- ``istos_wait_seconds`` and ``istos_run_seconds`` (histograms, ``queue`` label): how long jobs
  waited claimable before a claim, and how long deliveries were held (claim to ack, nack or
  lease expiry), since the owner started. Buckets (``le``, seconds): 0.005, 0.01, 0.025, 0.05,
  0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, +Inf (``istos.owner.views.latency``);
- ``istos_workers`` (gauge): workers the owner saw claim or renew lately;
- ``istos_batches_open`` (gauge): batches this queue is home to that have not finished
  (``docs/batches.md``);
- ``istos_worker_claimed_total``, ``istos_worker_acked_total``, ``istos_worker_nacked_total``,
  ``istos_worker_expired_total``, ``istos_worker_released_total`` (``queue`` and ``worker``
  labels): what happened to each worker's deliveries, counted by the owner since it first saw
  that worker (a worker silent for a few lease periods drops out, and starts again from 0).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..errors import IstosError
from .operator import Operator

WORKER_COUNTS = ("claimed", "acked", "nacked", "expired", "released")
WORKERS_KEY = "_workers"  # where a scrape keeps a queue's workers table beside its stats
BATCHES_KEY = "_batches_open"  # ... and how many batches it is home to are open


async def with_workers(op: Operator, queue: str, stats: dict[str, Any]) -> dict[str, Any]:
    """``stats`` with the owner's workers table (None when it did not answer for it)."""
    try:
        stats[WORKERS_KEY] = await op.workers(queue)
    except IstosError:
        stats[WORKERS_KEY] = None
    try:
        stats[BATCHES_KEY] = (await op.call(queue, "batches", limit=1))["open"]
    except (IstosError, KeyError):  # (an owner of a version without batches)
        stats[BATCHES_KEY] = None
    return stats


def families(stats: dict[str, dict[str, Any] | None]) -> Iterator[Any]:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    hists = {name: HistogramMetricFamily(
        f"istos_{name}_seconds", help_, labels=["queue"]) for name, help_ in (
        ("wait", "Seconds jobs waited claimable before a worker claimed them"),
        ("run", "Seconds deliveries were held, claim to ack, nack or lease expiry"))}
    workers = GaugeMetricFamily("istos_workers", "Workers seen claiming or renewing lately",
                                labels=["queue"])
    counters = {k: CounterMetricFamily(f"istos_worker_{k}", f"Deliveries {k} per worker, "
                                       "counted by the owner", labels=["queue", "worker"])
                for k in WORKER_COUNTS}
    batches = GaugeMetricFamily("istos_batches_open", "Batches this queue is home to that "
                                "have not finished", labels=["queue"])
    for queue, s in stats.items():
        if s is None:
            continue
        if s.get(BATCHES_KEY) is not None:
            batches.add_metric([queue], float(s[BATCHES_KEY]))
        for name, family in hists.items():
            hist = s.get(f"{name}_hist")
            if isinstance(hist, dict):
                buckets = [(_le(le), float(n)) for le, n in zip(hist["le"], hist["counts"])]
                family.add_metric([queue], buckets, float(hist["sum"]))
        rows = s.get(WORKERS_KEY)
        if rows is None:
            continue
        workers.add_metric([queue], float(len(rows)))
        for row in rows:
            for k, counter in counters.items():
                counter.add_metric([queue, str(row["worker"])], float(row.get(k) or 0))
    yield from (*hists.values(), workers, batches, *counters.values())


def _le(bound: Any) -> str:
    """A bucket bound as Prometheus writes it (``0.5``, ``1.0``, ``+Inf``)."""
    return bound if isinstance(bound, str) else repr(float(bound))
