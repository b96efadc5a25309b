"""The owner's enqueue cost with and without unique keys and debounce (docs/job-lifecycle.md).

    python -m bench.lifecycle [--jobs 5000] [--runs 12] [--durable]

In process (no mesh): the owner's ``enqueue`` and ``enqueue_many`` handlers, called as the
transport would, on a fresh queue per run. Rows: plain jobs (no key: the path every queue pays),
jobs with a unique key each (one dict lookup more), with one shared unique key (every call
after the first resolves to the holder), and calls joining one debounce burst (one record
write each). CPU time per job (``time.process_time``), the mean of the 3 best runs of
``--runs``: the machine's other load moves wall time more than CPU time.

To compare a queue using none of this against a tree without it, run the ``plain`` rows of
both trees on an idle machine; measured on a loaded 2-core machine (in-memory storage,
volatile): enqueue 10.4 us here vs 10.4 us without, enqueue_many 6.4 vs 6.7 us per item;
durable: 22.0 vs 20.8 us per enqueue, 10.5 vs 10.5 us per item.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

from istos import Istos, MemoryStorage
from istos.transport.local import LocalMesh

Msgs = Callable[[int], list[dict[str, Any]]]

ROWS: dict[str, Msgs] = {
    "enqueue plain": lambda n: [{"op": "enqueue", "body": b"x", "job_id": f"j{i}"}
                                for i in range(n)],
    "enqueue_many plain (500 per request)": lambda n: [
        {"op": "enqueue_many", "items": [{"body": b"x", "job_id": f"m{k}-{i}"}
                                         for i in range(500)]} for k in range(n // 500)],
    "enqueue, a unique key each": lambda n: [
        {"op": "enqueue", "body": b"x", "job_id": f"u{i}", "unique": {"key": f"k{i}"}}
        for i in range(n)],
    "enqueue, one unique key (held)": lambda n: [
        {"op": "enqueue", "body": b"x", "job_id": f"h{i}", "unique": {"key": "k"}}
        for i in range(n)],
    "enqueue, one debounce burst": lambda n: [
        {"op": "enqueue", "body": b"x", "job_id": f"d{i}",
         "debounce": {"key": "d", "s": 60.0}} for i in range(n)],
}


async def one_run(make: Msgs, jobs: int, durable: bool) -> float:
    app = Istos(transport=LocalMesh().transport("o"),
                storage=MemoryStorage(durable=True) if durable else None)
    app.queue("q")
    async with app.serving():
        owner = app.owners["q"]
        msgs = make(jobs)
        t0 = time.process_time()
        for msg in msgs:
            await owner.dispatch(msg, trusted=True)
        return (time.process_time() - t0) / jobs


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--durable", action="store_true", help="in-memory durable storage")
    args = parser.parse_args()
    print(f"{'row':<40} us/job (CPU, mean of 3 best of {args.runs})")
    for name, make in ROWS.items():
        runs = sorted([await one_run(make, args.jobs, args.durable) for _ in range(args.runs)])
        best = runs[:3]
        print(f"{name:<40} {sum(best) / len(best) * 1e6:8.2f}")


if __name__ == "__main__":
    asyncio.run(main())
