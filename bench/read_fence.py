"""What the read fence (``istos/owner/persistence/write_path.py``) costs a read, on a durable
Redis queue.

One in-process owner on the Redis at ``--redis`` (a key prefix of its own; nothing is flushed).
Two cases, each as an A/B inside one run, in interleaved rounds (medians of ``--rounds``):

- idle: a ``result`` read with no write in flight, through the fence (A) and straight to its
  handler (B): the fence's fast path, per read;
- busy: the same read while a closed loop of claim+ack keeps a write in flight: the fenced
  read waits for the group commit that takes what it saw (the price of never reporting a
  state storage does not hold).

    .venv/bin/python -m bench.read_fence [--reads 20000] [--rounds 3]

The machine may be shared: the 1-min load average is printed beside each figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

from bench._common import percentile, unique_prefix
from istos import Istos, RedisStoragePlugin

writes_done = [0]  # claim+ack rounds the writer made during a busy case


def load() -> str:
    return f"load {os.getloadavg()[0]:.2f}"


async def reads(app: Istos, fenced: bool, n: int, *, yield_between: bool = False) -> list[float]:
    owner = app.owners["q"]
    handler = owner.handler("result")
    assert handler is not None
    msg: dict[str, Any] = {"op": "result", "job_id": "probe"}
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        if fenced:
            await owner.writes.read(handler, msg)
        else:
            await handler(msg)
        out.append(time.perf_counter() - t0)
        if yield_between:  # reads spread over the writer's round trips (not timed)
            await asyncio.sleep(0.001)
    return out


async def churn(app: Istos, stop: asyncio.Event) -> None:
    """Claim and ack one job at a time, in a closed loop: a write is nearly always in flight."""
    client = app.client("q")
    while not stop.is_set():
        reply = await client.call("claim", workers=["w#0"], node="w")
        for job in reply["jobs"]:
            await client.call("ack", job_id=job["job_id"], token=job["token"], result=None)
            await app.enqueue("q", {"i": 0})
            writes_done[0] += 1


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--reads", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    app = Istos(storage=RedisStoragePlugin(args.redis, key_prefix=unique_prefix()))
    app.queue("q", lease_s=600.0)
    async with app.serving():
        await app.enqueue("q", {"i": 0}, job_id="probe")
        for _ in range(8):
            await app.enqueue("q", {"i": 0})
            writes_done[0] += 1
        figures: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for fenced in (True, False):  # idle: per-read mean, microseconds
                samples = await reads(app, fenced, args.reads)
                figures.setdefault(f"idle {'A fenced' if fenced else 'B direct'}", []).append(
                    statistics.fmean(samples) * 1e6)
            stop = asyncio.Event()
            writer = asyncio.create_task(churn(app, stop))
            await asyncio.sleep(0.2)  # the writer's loop is under way (a bench, not a test)
            for fenced in (True, False):  # busy: p50 of a read, microseconds
                samples = await reads(app, fenced, max(300, args.reads // 50),
                                      yield_between=True)
                name = 'A fenced' if fenced else 'B direct'
                for q in (50, 90):
                    figures.setdefault(f"busy {name} p{q}", []).append(
                        percentile(samples, q) * 1e6)
            stop.set()
            await writer
            figures.setdefault("busy writes done", []).append(float(writes_done[0]))
            writes_done[0] = 0
        for name, values in figures.items():
            unit = "" if name.endswith("done") else " us"  # (a count of claim+ack rounds)
            print(f"{name:24s} median {statistics.median(values):9.2f}{unit}   "
                  f"rounds {', '.join(f'{v:.2f}' for v in values)}   {load()}")


if __name__ == "__main__":
    asyncio.run(main())
