"""Dependencies: memory per waiting job, and the cost of enqueueing and releasing one.

    python -m bench.deps [--children 2000] [--rounds 3]

Three apps in this process, each with its own Zenoh session on a private loopback mesh: the
**parents' owner** (queue ``parents``), the **children's owner** (queue ``children``) and the
**producer**. In-memory storage. Each round, interleaved (A/B inside one run):

- ``memory``: bytes of Python heap (``tracemalloc``, both owners together: the child's record
  and meta at its owner, the parent's watch at its owner) per child waiting for one pending
  parent, against a plain job delayed by an hour (the same body): the extra is what waiting
  costs;
- ``enqueue``: µs per child enqueued with ``after=[parent]`` (a ``dep_watch`` to the parent's
  owner, the enqueue, and the child's owner asking the parent again), against a plain enqueue;
- ``release``: µs per child, from the parent's ack to the last child ``unblocked`` (one
  ``dep_report`` per child from the parent's owner, one record write each).

Figures are medians of ``--rounds``, printed with the 1-minute load average: the machine
these run on is shared, so read ratios, not absolute times. Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
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
from istos.events import JobEvent  # noqa: E402


def apps() -> tuple[Istos, Istos, Istos]:
    configs, prefix = isolated_configs(3), f"bench-deps/{secrets.token_hex(4)}"
    parents = Istos(zenoh=configs[0], prefix=prefix, node_id="parents", request_timeout_s=30.0)
    children = Istos(zenoh=configs[1], prefix=prefix, node_id="children",
                     request_timeout_s=30.0)
    producer = Istos(zenoh=configs[2], prefix=prefix, node_id="producer",
                     request_timeout_s=30.0)
    parents.queue("parents", admin=True)
    children.queue("children")
    return parents, children, producer


async def one_round(n: int) -> dict[str, float]:
    parents, children, producer = apps()
    out: dict[str, float] = {}
    released = asyncio.Event()
    unblocked = [0]

    def on_event(event: JobEvent) -> None:
        if event.kind == "unblocked":
            unblocked[0] += 1
            if unblocked[0] >= n:
                released.set()

    children.events.subscribe(on_event)
    async with parents.serving(), children.serving(), producer.serving():
        parent = await producer.enqueue("parents", "p")
        await producer.enqueue("children", 0, delay_s=3600)  # warm up (imports, caches)
        await producer.enqueue("children", 0, after=[parent])
        gc.collect()
        tracemalloc.start()
        t0 = time.perf_counter()
        base = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            await producer.enqueue("children", i, delay_s=3600)
        out["plain_us"] = (time.perf_counter() - t0) / n * 1e6
        gc.collect()
        mid = tracemalloc.get_traced_memory()[0]
        t0 = time.perf_counter()
        for i in range(n):
            await producer.enqueue("children", i, after=[parent])
        out["after_us"] = (time.perf_counter() - t0) / n * 1e6
        await asyncio.sleep(0)  # (the owners' follow-up dep_watch run in the background)
        await _settled(children, n + 1)
        gc.collect()
        end = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        out["plain_bytes"] = (mid - base) / n
        out["waiting_bytes"] = (end - mid) / n
        job = await _claim(parents)
        t0 = time.perf_counter()
        await parents.client("parents").call("ack", job_id=job["job_id"], token=job["token"])
        await asyncio.wait_for(released.wait(), 600)
        out["release_us"] = (time.perf_counter() - t0) / n * 1e6
    return out


async def _settled(app: Istos, waiting: int) -> None:
    """Until the children's owner holds ``waiting`` waiting jobs (bounded)."""
    for _ in range(10_000):
        if app.owners["children"].state.counts["waiting"] >= waiting:
            return
        await asyncio.sleep(0.001)
    raise RuntimeError("the children never all waited")


async def _claim(app: Istos) -> dict[str, Any]:
    reply = await app.client("parents").call("claim", workers=["bench-slot"], node="bench")
    return reply["jobs"][0]  # type: ignore[no-any-return]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--children", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    rounds = []
    for _ in range(a.rounds):
        rounds.append(await one_round(a.children))
        print(f"  round {len(rounds)}: " + ", ".join(f"{k} {v:.0f}" for k, v in
                                                     rounds[-1].items()), flush=True)

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rounds)

    load = os.getloadavg()[0]
    print(f"load(1 min) {load:.2f}; {a.children} children, median of {a.rounds} rounds")
    print(f"memory   {med('waiting_bytes'):8.0f} bytes per waiting job (child + parent's watch)"
          f", {med('plain_bytes'):.0f} per plain delayed job: "
          f"{med('waiting_bytes') - med('plain_bytes'):.0f} extra")
    print(f"enqueue  {med('after_us'):8.1f} µs per child with after=[parent], "
          f"{med('plain_us'):.1f} plain ({med('after_us') / med('plain_us'):.2f}x)")
    print(f"release  {med('release_us'):8.1f} µs per child, parent's ack to unblocked")


if __name__ == "__main__":
    asyncio.run(main())
