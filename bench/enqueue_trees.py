"""The owner's plain enqueue cost in two source trees, A/B in one run.

    .venv/bin/python -m bench.enqueue_trees TREE_A TREE_B [--rounds 5]

``TREE_A`` and ``TREE_B`` are checkouts of this repository (``git worktree add --detach DIR
REV``). Each round runs one child process per tree (the order alternates round by round), with
``PYTHONPATH=TREE`` so the child imports that tree's ``istos``: a fresh in-process app per run
(volatile, then durable ``MemoryStorage``), 5,000 plain ``enqueue`` requests (and 10
``enqueue_many`` of 500) dispatched as the transport would, then 5,000 claims of one job
each carrying the previous job's ack (a worker's claim-and-settle), CPU time per job, the mean
of the best 3 of 8 runs. The table shows medians over rounds and their ratio; the 1-min load is
printed before each child. What a queue that uses no lifecycle, batch or dependency option
pays per enqueue and per claim compared with an older tree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r'''
import asyncio, json, time
from istos import Istos, MemoryStorage
from istos.transport.local import LocalMesh

ROWS = {
    "enqueue": lambda n: [{"op": "enqueue", "body": b"x", "job_id": f"j{i}"} for i in range(n)],
    "enqueue_many": lambda n: [
        {"op": "enqueue_many", "items": [{"body": b"x", "job_id": f"m{k}-{i}"}
                                         for i in range(500)]} for k in range(n // 500)],
}

async def one(make, durable):
    app = Istos(transport=LocalMesh().transport("o"),
                storage=MemoryStorage(durable=True) if durable else None)
    app.queue("q")
    async with app.serving():
        owner = app.owners["q"]
        msgs = make(5000)
        t0 = time.process_time()
        for m in msgs:
            await owner.dispatch(m, trusted=True)
        return (time.process_time() - t0) / 5000

async def claim_settle(durable):
    """5,000 jobs queued, then claimed one per request by one slot, each claim carrying the
    ack of the job before (as a worker's claim does): CPU per job."""
    app = Istos(transport=LocalMesh().transport("o"),
                storage=MemoryStorage(durable=True) if durable else None)
    app.queue("q")
    async with app.serving():
        owner = app.owners["q"]
        for i in range(5000):
            await owner.dispatch({"op": "enqueue", "body": b"x", "job_id": f"j{i}"},
                                 trusted=True)
        held = None
        t0 = time.process_time()
        for _ in range(5000):
            msg = {"op": "claim", "workers": ["w#0"], "node": "w"}
            if held is not None:
                msg["settle"] = [{"op": "ack", "job_id": held[0], "token": held[1]}]
            reply = await owner.dispatch(msg, trusted=True)
            job = reply["jobs"][0]
            held = (job["job_id"], job["token"])
        return (time.process_time() - t0) / 5000

async def main():
    out = {}
    for durable in (False, True):
        for name, make in ROWS.items():
            runs = sorted([await one(make, durable) for _ in range(8)])
            out[name + (" durable" if durable else "")] = sum(runs[:3]) / 3 * 1e6
        runs = sorted([await claim_settle(durable) for _ in range(8)])
        out["claim+ack" + (" durable" if durable else "")] = sum(runs[:3]) / 3 * 1e6
    print(json.dumps(out))

asyncio.run(main())
'''


def run(tree: str) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                         check=True, cwd=os.path.abspath(tree))
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("tree_a")
    parser.add_argument("tree_b")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    trees = (args.tree_a, args.tree_b)
    results: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            load = os.getloadavg()[0]
            results[tree].append(run(tree))
            print(f"round {r} {tree} (load {load:.2f}): " + ", ".join(
                f"{k} {v:.2f}" for k, v in results[tree][-1].items()), flush=True)
    print(f"\n{'us per job (CPU)':<22} {'A':>8} {'B':>8} {'A/B':>7}")
    for key in results[args.tree_a][0]:
        a = statistics.median(x[key] for x in results[args.tree_a])
        b = statistics.median(x[key] for x in results[args.tree_b])
        print(f"{key:<22} {a:8.2f} {b:8.2f} {a / b:7.3f}")


if __name__ == "__main__":
    main()
