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

    .venv/bin/python -m bench.enqueue_trees TREE_A TREE_B --instructions

counts instructions instead of CPU seconds: each tree's child runs under ``valgrind
--tool=callgrind`` with 1,000 and then 3,000 jobs, and the difference of the two totals over
2,000 jobs is the cost per job, free of the start-up's (imports, the app's start). The counts
repeat to about 0.1% whatever else the machine is doing (the hash seed is fixed), so a
difference of a percent is a real one; a run takes about four minutes. Needs ``valgrind`` on
PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

WORK = r'''
import asyncio, json, sys, time
from contextlib import asynccontextmanager
from istos import Istos, MemoryStorage
from istos.transport.local import LocalMesh

ROWS = {
    "enqueue": lambda n: [{"op": "enqueue", "body": b"x", "job_id": f"j{i}"} for i in range(n)],
    "enqueue_many": lambda n: [
        {"op": "enqueue_many", "items": [{"body": b"x", "job_id": f"m{k}-{i}"}
                                         for i in range(500)]} for k in range(n // 500)],
}

@asynccontextmanager
async def serving_owner(durable):
    # A fresh in-process app serving queue "q" (volatile, or durable MemoryStorage).
    app = Istos(transport=LocalMesh().transport("o"),
                storage=MemoryStorage(durable=True) if durable else None)
    app.queue("q")
    async with app.serving():
        yield app.owners["q"]

async def send(owner, msgs):
    for m in msgs:
        await owner.dispatch(m, trusted=True)

async def claim_acks(owner, n):
    # n claims of one job each by one slot, each carrying the ack of the job before (as a
    # worker's claim does).
    held = None
    for _ in range(n):
        msg = {"op": "claim", "workers": ["w#0"], "node": "w"}
        if held is not None:
            msg["settle"] = [{"op": "ack", "job_id": held[0], "token": held[1]}]
        job = (await owner.dispatch(msg, trusted=True))["jobs"][0]
        held = (job["job_id"], job["token"])
'''
"""The owner and the requests both children send (each child script starts with it)."""

CHILD = WORK + r'''
async def one(make, durable):
    async with serving_owner(durable) as owner:
        msgs = make(5000)
        t0 = time.process_time()
        await send(owner, msgs)
        return (time.process_time() - t0) / 5000

async def claim_settle(durable):
    # 5,000 jobs queued, then claimed and acked (claim_acks): CPU per job.
    async with serving_owner(durable) as owner:
        await send(owner, ROWS["enqueue"](5000))
        t0 = time.process_time()
        await claim_acks(owner, 5000)
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


COUNT_CHILD = WORK + r'''
async def main(phase, n, durable):
    async with serving_owner(durable) as owner:
        await send(owner, ROWS["enqueue_many" if phase == "enqueue_many" else "enqueue"](n))
        if phase == "claim+ack":
            await claim_acks(owner, n)

asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"))
'''
COUNT_JOBS = (1000, 3000)


def instructions(tree: str, phase: str, n: int, durable: bool) -> int:
    """The instructions one child run executed in all (callgrind's total)."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), PYTHONHASHSEED="0")
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         "-c", COUNT_CHILD, phase, str(n), "1" if durable else "0"],
        env=env, capture_output=True, text=True, check=True, cwd=os.path.abspath(tree))
    match = re.search(r"Collected : (\d+)", out.stderr)
    if match is None:
        raise RuntimeError(f"no instruction count in valgrind's output: {out.stderr[-500:]}")
    return int(match.group(1))


def count(tree: str) -> dict[str, float]:
    """Instructions per job of each row, in thousands: the difference between the runs of
    3,000 and of 1,000 jobs over 2,000 (for claim+ack, less that of the enqueues before)."""
    small, large = COUNT_JOBS
    out: dict[str, float] = {}
    for durable in (False, True):
        suffix = " durable" if durable else ""
        per_job = {phase: (instructions(tree, phase, large, durable)
                           - instructions(tree, phase, small, durable)) / (large - small)
                   for phase in ("enqueue", "enqueue_many", "claim+ack")}
        out["enqueue" + suffix] = per_job["enqueue"] / 1000
        out["enqueue_many" + suffix] = per_job["enqueue_many"] / 1000
        out["claim+ack" + suffix] = (per_job["claim+ack"] - per_job["enqueue"]) / 1000
    return out


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
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions under callgrind (one round) instead")
    args = parser.parse_args()
    trees = (args.tree_a, args.tree_b)
    if args.instructions:
        if shutil.which("valgrind") is None:
            sys.exit("--instructions needs valgrind on PATH")
        counts = {tree: count(tree) for tree in trees}
        print(f"\n{'k instructions per job':<22} {'A':>8} {'B':>8} {'A/B':>7}")
        for key, a in counts[args.tree_a].items():
            b = counts[args.tree_b][key]
            print(f"{key:<22} {a:8.1f} {b:8.1f} {a / b:7.3f}")
        return
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
