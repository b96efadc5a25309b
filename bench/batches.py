"""Batches: the cost per member added and per member settled, and memory per open batch.

    python -m bench.batches [--members 5000] [--runs 3] [--batches 2000]

Three apps in this process, each with its own Zenoh session on a private loopback mesh: the
**home** (owns the callback queue ``cb``, so it keeps the batch), the **members' owner** (owns
queue ``work``) and the **worker** (concurrency 8, no-op handler). In-memory storage.

- ``add``: ``batch.add`` called one after another from the home node: one ``batch_add`` to the
  home (in-process) and one enqueue to the members' owner (over Zenoh) per member; µs/member.
- ``settle``: the worker starts with all members queued; from its start to the ``on_complete``
  callback, µs/member. ``plain``: the same jobs without a batch (baseline); the difference is
  the report each member's ack waits for (one round trip to the home and one storage write).
- ``memory``: bytes of Python heap per open batch at the home (``tracemalloc``), ``--batches``
  batches opened, none with members (members live in storage, not in the home's memory).

Figures are medians of ``--runs``. Not a test: measure on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import secrets
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from zenoh_util import isolated_configs  # noqa: E402

from istos import Istos  # noqa: E402


def apps(done: asyncio.Event, count: list[int], expect: list[int]
         ) -> tuple[Istos, Istos, Istos]:
    configs, prefix = isolated_configs(3), f"bench-batch/{secrets.token_hex(4)}"
    home = Istos(zenoh=configs[0], prefix=prefix, node_id="home", request_timeout_s=30.0)
    owner = Istos(zenoh=configs[1], prefix=prefix, node_id="owner", request_timeout_s=30.0)
    members = Istos(zenoh=configs[2], prefix=prefix, node_id="members",
                    request_timeout_s=30.0)
    home.queue("cb")
    owner.queue("work")

    @home.worker("cb")
    async def callback(body: dict[str, Any]) -> None:
        done.set()

    @members.worker("work", concurrency=8)
    async def work(n: int) -> None:
        count[0] += 1
        if count[0] >= expect[0]:
            done.set()

    return home, owner, members


async def one_run(n: int) -> dict[str, float]:
    done, count, expect = asyncio.Event(), [0], [n]
    home, owner, members = apps(done, count, expect)
    out: dict[str, float] = {}
    async with home.serving(), owner.serving():
        batch = await home.batch(on_complete=("cb", None))
        t0 = time.perf_counter()
        for i in range(n):
            await batch.add("work", i)
        out["add_us"] = (time.perf_counter() - t0) / n * 1e6
        await batch.close()
        t0 = time.perf_counter()
        async with members.serving():
            await asyncio.wait_for(done.wait(), 600)
            out["settle_us"] = (time.perf_counter() - t0) / n * 1e6
    # The baseline: the same members without a batch.
    done, count = asyncio.Event(), [0]
    home, owner, members = apps(done, count, expect)
    async with home.serving(), owner.serving():
        await home.enqueue_many("work", list(range(n)))
        t0 = time.perf_counter()
        async with members.serving():
            await asyncio.wait_for(done.wait(), 600)
            out["plain_us"] = (time.perf_counter() - t0) / n * 1e6
    return out


async def memory(k: int) -> float:
    done = asyncio.Event()
    home, _, _ = apps(done, [0], [0])
    async with home.serving():
        await home.batch(on_complete=("cb", None))  # warm up (imports, caches)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        handles = [await home.batch(on_complete=("cb", None)) for _ in range(k)]
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del handles
    return (after - before) / k


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--members", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batches", type=int, default=2000)
    a = ap.parse_args()
    runs = [await one_run(a.members) for _ in range(a.runs)]
    for key in ("add_us", "settle_us", "plain_us"):
        print(f"{key:10} {statistics.median(r[key] for r in runs):9.1f} µs/member "
              f"({a.members} members, median of {a.runs})")
    settle = statistics.median(r["settle_us"] - r["plain_us"] for r in runs)
    print(f"{'report':10} {settle:9.1f} µs/member settled, over a plain job")
    # (the memory figure includes the creator's handles, a few hundred bytes each)
    print(f"{'memory':10} {await memory(a.batches):9.0f} bytes per open batch at the home "
          "(and its creator's handle)")


if __name__ == "__main__":
    asyncio.run(main())
