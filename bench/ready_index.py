"""What the index of ready jobs (``istos/core/ready_order.py``, made by the first ``why``)
costs the hot path: CPU time per enqueue, per claim and per ack on a queue's state, without and
with the index, in interleaved rounds (medians), and the bytes it keeps per ready job
(tracemalloc).

    .venv/bin/python -m bench.ready_index [--jobs 100000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
import tracemalloc

from istos.core.ready_order import ReadyOrder
from istos.core.records import QueuePolicy
from istos.core.state import QueueState

SLOTS = [f"bench:w#{i}" for i in range(16)]


def run(jobs: int, indexed: bool) -> tuple[float, float, float]:
    """Microseconds of CPU per enqueue, claim (16 slots a call) and ack of ``jobs`` jobs."""
    state = QueueState("q", QueuePolicy())
    if indexed:
        state.heaps.order = ReadyOrder()
        state.heaps.order.complete = True
    enabled = gc.isenabled()
    gc.disable()
    try:
        t0 = time.thread_time()
        for i in range(jobs):
            state.enqueue(f"j{i}", b"x", 1000.0 + i * 1e-5)
            if i % 1024 == 0:
                state.drain()
        state.drain()
        t1 = time.thread_time()
        leased = []
        for _ in range(0, jobs, len(SLOTS)):
            leased += state.claim(SLOTS, 2000.0)
            state.drain()
        t2 = time.thread_time()
        for rec in leased:
            state.ack(rec.job_id, rec.lease_token or "", 2001.0)
        state.drain()
        t3 = time.thread_time()
    finally:
        if enabled:
            gc.enable()
    return (t1 - t0) / jobs * 1e6, (t2 - t1) / jobs * 1e6, (t3 - t2) / jobs * 1e6


def bytes_per_job(jobs: int, indexed: bool) -> float:
    """Bytes the state holds per ready job (100-byte bodies), by tracemalloc."""
    tracemalloc.start()
    state = QueueState("q", QueuePolicy())
    if indexed:
        state.heaps.order = ReadyOrder()
    for i in range(jobs):
        state.enqueue(f"j{i:07d}", bytes(100), 1000.0 + i * 1e-5)
    state.drain()
    held = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return held / jobs


def main(args: argparse.Namespace) -> None:
    print(f"(1-min load at the start: {os.getloadavg()[0]:.2f})")
    figures: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    for _ in range(args.rounds):
        for indexed in (False, True):
            figures[indexed].append(run(args.jobs, indexed))
    for indexed in (False, True):
        enq, claim, ack = (statistics.median(col) for col in zip(*figures[indexed]))
        print(f"{'with the index' if indexed else 'without':>15}: enqueue {enq:.2f} us, claim "
              f"{claim:.2f} us, ack {ack:.2f} us (per job, median of {args.rounds}); "
              f"{bytes_per_job(args.jobs, indexed):.0f} bytes per ready job")
    print(f"(1-min load at the end: {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    main(parser.parse_args())
