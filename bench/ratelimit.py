"""Claim-path cost of a rate-limited queue (issue 30), next to the same queue unlimited.

    PYTHONPATH=. .venv/bin/python -m bench.ratelimit [--runs 5] [--batch 5000] [--backlog 100000]

Measured two ways, as in ``bench/_owner_cost.py``: ``state`` (``QueueState.claim`` of one slot,
then ``drain()``) and ``owner`` (a ``claim`` request through ``QueueOwner.dispatch`` of an app on
the in-process mesh, no transport hop), on a backlog of ready jobs, three queues:

- ``none``: no ``rate_limit`` (what every queue paid before issue 30);
- ``open``: ``rate_limit=(1_000_000, 1)``, a limit the batch never reaches (the bucket's own cost);
- ``shut``: ``rate_limit=(1, 3600)``, every claim after the first refused (a throttled claim).

Microseconds per claim, the median of ``--runs`` batches; runs alternate between the queues so a
busy machine's noise hits them alike. Prints figures; never asserts (see bench/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from istos import Istos
from istos.clock import ManualClock
from istos.core.state import QueuePolicy, QueueState
from istos.transport.local import LocalMesh

BODY = bytes(range(100))
LIMITS: dict[str, tuple[int, float] | None] = {
    "none": None, "open": (1_000_000, 1.0), "shut": (1, 3600.0)}


def fill(state: QueueState, n: int, tag: str) -> None:
    for i in range(n):
        state.enqueue(f"{tag}-{i:012x}", BODY, 0.0)
    state.drain()


def state_claims(limit: tuple[int, float] | None, backlog: int, batch: int) -> float:
    state = QueueState("q", QueuePolicy(rate_limit=limit))
    fill(state, backlog + batch, "s")
    slot = ["bench:w#0"]
    t0 = time.perf_counter_ns()
    for i in range(batch):
        state.claim(slot, i * 1e-6)
        state.drain()
    return (time.perf_counter_ns() - t0) / 1e3 / batch


async def owner_claims(limit: tuple[int, float] | None, backlog: int, batch: int) -> float:
    clock = ManualClock()
    app = Istos(transport=LocalMesh().transport("bench-owner"), clock=clock)
    app.queue("q", lease_s=3600.0, rate_limit=limit)
    async with app.serving():
        owner = app.owners["q"]
        fill(owner.state, backlog + batch, "o")
        msg = {"v": 1, "op": "claim", "workers": ["bench:w#0"]}
        dispatch = owner.dispatch
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            reply = await dispatch(msg)
        elapsed = time.perf_counter_ns() - t0
        assert reply.get("ok"), reply
    return elapsed / 1e3 / batch


async def main(args: argparse.Namespace) -> None:
    got: dict[tuple[str, str], list[float]] = {}
    for run in range(args.runs):
        for name, limit in LIMITS.items():
            got.setdefault(("state", name), []).append(
                state_claims(limit, args.backlog, args.batch))
            got.setdefault(("owner", name), []).append(
                await owner_claims(limit, args.backlog, args.batch))
        print(f"run {run + 1}/{args.runs} done", flush=True)
    print(f"\nclaim of one slot, us per claim (median of {args.runs} batches of {args.batch}, "
          f"backlog {args.backlog:,})")
    print(f"{'level':6} {'none':>8} {'open':>8} {'shut':>8} {'open/none':>10} {'shut/none':>10}")
    for level in ("state", "owner"):
        med: dict[str, Any] = {n: statistics.median(got[(level, n)]) for n in LIMITS}
        print(f"{level:6} {med['none']:8.2f} {med['open']:8.2f} {med['shut']:8.2f} "
              f"{med['open'] / med['none']:9.2f}x {med['shut'] / med['none']:9.2f}x")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--batch", type=int, default=5000)
    p.add_argument("--backlog", type=int, default=100_000)
    asyncio.run(main(p.parse_args()))
