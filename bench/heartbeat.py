"""Heartbeat cost: renewal traffic per worker, and short-job throughput with and without.

    .venv/bin/python -m bench.heartbeat [--runs 3] [--jobs 5000] [--window-s 9]

1. Traffic: one worker holds 1 job, then 1,000 jobs (``concurrency`` = held, each job sleeps
   through the window); the owner counts the ``extend`` requests and renewed items it receives.
   Target: one request per worker per ``lease_s / 3`` whatever the number of jobs held.
2. Throughput: ``--jobs`` no-op jobs drained by one worker (``concurrency=8``, owner and worker
   in separate apps over a private loopback Zenoh mesh, ``lease_s=1`` so heartbeats do fire
   every 1/3 s), ``heartbeat=True`` vs ``False``, runs alternated. Target: within 5%.

Prints figures; never asserts (see bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from bench._common import make_job, unique_prefix, zenoh_configs
from istos import Istos
from istos.owner.extension import Hooks


def _apps() -> tuple[Istos, Istos]:
    configs, prefix = zenoh_configs(2), unique_prefix()
    return (Istos(zenoh=configs[0], prefix=prefix, node_id="owner"),
            Istos(zenoh=configs[1], prefix=prefix, node_id="worker"))


async def traffic(held: int, window_s: float, lease_s: float) -> dict[str, Any]:
    """Extend requests the owner receives while one worker holds ``held`` sleeping jobs."""
    owner, worker = _apps()
    owner.queue("q", lease_s=lease_s, sweep_interval_s=min(1.0, lease_s / 4))
    started = asyncio.Event()
    running = 0

    @worker.worker("q", concurrency=held, heartbeat=True, prefetch=0, poll_interval_s=0.2)
    async def sleeper(job: Any) -> None:
        nonlocal running
        running += 1
        if running == held:
            started.set()
        await asyncio.sleep(window_s + 2 * lease_s)

    counts = {"requests": 0, "items": 0}
    async with owner.serving():
        served = owner.owners["q"]
        extend = served.handler("extend")
        assert extend is not None

        async def counting(msg: dict[str, Any]) -> dict[str, Any]:
            counts["requests"] += 1
            counts["items"] += len(msg.get("items") or ())
            return await extend(msg)

        served.extend(Hooks(ops={"extend": counting}))
        for i in range(held):
            await owner.enqueue("q", make_job(i))
        async with worker.serving():
            await asyncio.wait_for(started.wait(), 60)
            counts.update(requests=0, items=0)  # count from the moment all are held
            t0 = time.perf_counter()
            await asyncio.sleep(window_s)
            elapsed = time.perf_counter() - t0
            expired = owner.owners["q"].state.counts["ready"]
            worker.runners[0].kill()  # no need to wait for the sleepers
    intervals = elapsed / (lease_s / 3)
    return {"held": held, "requests": counts["requests"], "items": counts["items"],
            "per_interval": counts["requests"] / intervals,
            "items_per_request": counts["items"] / max(1, counts["requests"]),
            "reclaimed": expired}


async def drain(jobs: int, heartbeat: bool, lease_s: float) -> float:
    """Jobs per second for one worker draining ``jobs`` pre-enqueued no-op jobs."""
    owner, worker = _apps()
    owner.queue("q", lease_s=lease_s)
    done = asyncio.Event()
    seen = 0

    @worker.worker("q", concurrency=8, heartbeat=heartbeat)
    async def noop(job: Any) -> None:
        nonlocal seen
        seen += 1
        if seen == jobs:
            done.set()

    async with owner.serving():
        for i in range(jobs):
            await owner.enqueue("q", make_job(i))
        async with worker.serving():
            t0 = time.perf_counter()
            await asyncio.wait_for(done.wait(), 300)
            elapsed = time.perf_counter() - t0
    return jobs / elapsed


async def main(args: argparse.Namespace) -> None:
    lease_s = 3.0
    print(f"1. renewal traffic: one worker, lease_s={lease_s:g} (an interval is "
          f"lease_s/3 = {lease_s / 3:g} s), window {args.window_s:g} s")
    print(f"{'held jobs':>10} {'requests':>9} {'per interval':>13} {'items/request':>14} "
          f"{'reclaimed':>10}")
    for held in (1, 1000):
        r = await traffic(held, args.window_s, lease_s)
        print(f"{r['held']:>10} {r['requests']:>9} {r['per_interval']:>13.2f} "
              f"{r['items_per_request']:>14.0f} {r['reclaimed']:>10}")
    print(f"\n2. short-job throughput: {args.jobs} no-op jobs, concurrency 8, lease_s=1, "
          f"{args.runs} runs each (alternated)")
    rates: dict[bool, list[float]] = {False: [], True: []}
    for run in range(args.runs):
        for hb in ((False, True) if run % 2 == 0 else (True, False)):
            rates[hb].append(await drain(args.jobs, hb, 1.0))
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    print(f"{'heartbeat':>10} {'median jobs/s':>14} {'runs':>30}")
    for hb, med in ((False, off), (True, on)):
        runs = ", ".join(f"{x:.0f}" for x in rates[hb])
        print(f"{hb!s:>10} {med:>14.0f} {runs:>30}")
    ratio = on / off
    print(f"heartbeat=True / False = {ratio:.3f} (target >= 0.95: "
          f"{'yes' if ratio >= 0.95 else 'NO'})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--window-s", type=float, default=9.0)
    asyncio.run(main(parser.parse_args()))
