"""The cost of a claim when every fairness group waits at its cap.

``--groups`` groups (default 20,000) of a queue with ``group_concurrency=1`` each hold one
leased job and one ready one, so no claim can take anything: a claim still turns the groups'
rotation, but looks at most ``MAX_SCAN`` groups per slot look (``istos/core/groups.py``). For a
growing number of blocked groups, the CPU time (``time.thread_time``) of a 1,024-slot claim,
twice: on the queue's state alone (``QueueState.claim``) and through the owner of an app on
the in-process mesh (``dispatch``: schema check, claim, reply); median and longest of
``--rounds`` claims. It should not grow with the number of groups past ``MAX_SCAN``.

    .venv/bin/python -m bench.group_rotation [--groups 20000] [--rounds 21]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

from istos import Istos
from istos.core.groups import MAX_SCAN
from istos.core.records import QueuePolicy
from istos.core.state import QueueState
from istos.protocol import MAX_SLOTS

SLOTS = [f"bench:w#{i}" for i in range(MAX_SLOTS)]


def blocked_state(groups: int) -> QueueState:
    """A queue whose ``groups`` groups each hold a leased job and wait with a ready one."""
    state = QueueState("q", QueuePolicy(group_concurrency=1))
    for g in range(groups):
        for k in range(2):
            state.enqueue(f"g{g}-{k}", b"x", 0.0, group=f"g{g}")
    state.drain()
    leased = 0
    while leased < groups:
        leased += len(state.claim(SLOTS, 1.0))
    state.drain()
    return state


def timed(call: Any, rounds: int) -> tuple[float, float]:
    """Median and longest CPU time of ``call()`` in ms."""
    times = []
    for _ in range(rounds):
        t0 = time.thread_time()
        call()
        times.append((time.thread_time() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2], times[-1]


async def through_owner(groups: int, rounds: int) -> tuple[float, float]:
    """The same, as the owner serves a claim request (in-process, no transport hop)."""
    app = Istos(node_id="owner")
    app.queue("q", group_concurrency=1, lease_s=3600.0)
    async with app.serving():
        for start in range(0, groups, 2000):
            names = range(start, min(groups, start + 2000))
            await app.enqueue_many("q", [{"g": g} for g in names for _ in range(2)],
                                   groups=[f"g{g}" for g in names for _ in range(2)])
        owner = app.client("q").node.local_owner("q")
        assert owner is not None
        msg = {"v": 1, "op": "claim", "workers": SLOTS, "node": "bench"}
        leased = 0
        while leased < groups:
            leased += len((await owner.dispatch(dict(msg)))["jobs"])
        times = []
        for _ in range(rounds):
            t0 = time.thread_time()
            reply = await owner.dispatch(dict(msg))
            times.append((time.thread_time() - t0) * 1e3)
            assert reply["jobs"] == [], reply
        times.sort()
        return times[len(times) // 2], times[-1]


def main(args: argparse.Namespace) -> None:
    print(f"(1-min load at the start: {os.getloadavg()[0]:.2f}; MAX_SCAN {MAX_SCAN})")
    print(f"{'blocked groups':>14} {'state p50':>10} {'max':>8} {'owner p50':>10} {'max':>8}"
          "   (CPU ms per 1,024-slot claim)")
    sizes = sorted({min(args.groups, n) for n in (MAX_SCAN, 2_000, args.groups)})
    for n in sizes:
        state = blocked_state(n)
        s50, smax = timed(lambda state=state: state.claim(SLOTS, 2.0), args.rounds)
        o50, omax = asyncio.run(through_owner(n, args.rounds))
        print(f"{n:>14,} {s50:>7.2f} ms {smax:>5.2f} ms {o50:>7.2f} ms {omax:>5.2f} ms",
              flush=True)
    print(f"(1-min load at the end: {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=21)
    main(parser.parse_args())
