"""Durable end to end, one sequential producer: the persister's write order, A/B in one run.

    .venv/bin/python -m bench.durable_overlap [--rounds 3] [--jobs 2000]

The owner runs in this process with Redis storage (127.0.0.1:6379, a random key prefix, wiped
after), the worker (concurrency 8, a no-op handler) in its own process over a private loopback
Zenoh mesh, as ``bench.peers``'s ``istos-redis``. A producer in this process awaits each of
``--jobs`` enqueues. Variants of :class:`istos.owner.persist.Persister`, interleaved round by
round (order rotated), on the same owner and worker:

- ``in order``: ``overtake = False``, ``hand_over = False`` (each batch after the one before,
  and the caller that started the writing writes all that queued behind it before replying);
- ``hand over``: ``hand_over = True`` only (that caller replies once its own batch is stored);
- ``overtake``: both (the default: also a side write for keys not in the batch in flight).

Per block: enqueue p50 ms, e2e jobs/s (first enqueue -> the owner holds no job: every job
acked), the writes and how many of them found a write in flight; the 1-min load. Then medians
and each as a ratio to ``in order``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from _common import zenoh_configs  # noqa: E402

QUEUE = "bench/durable"
VARIANTS: dict[str, dict[str, bool]] = {
    "in order": {"overtake": False, "hand_over": False},
    "hand over": {"overtake": False, "hand_over": True},
    "overtake": {"overtake": True, "hand_over": True},
}
WORKER = (
    "import asyncio, json, sys\n"
    "from istos import Istos\n"
    "async def main():\n"
    "    app = Istos(zenoh=json.loads(sys.argv[1]), prefix=sys.argv[2])\n"
    f"    @app.worker({QUEUE!r}, concurrency=8)\n"
    "    async def handle(body):\n"
    "        pass\n"
    "    async with app.serving():\n"
    "        print('READY', flush=True)\n"
    "        await asyncio.to_thread(sys.stdin.readline)\n"
    "asyncio.run(main())\n")


async def block(app: Any, jobs: int) -> dict[str, float]:
    from istos.owner import persist

    counts = {"writes": 0, "behind": 0}
    write = persist.Persister.write

    async def counted(self: Any, changes: Any, undo: Any = None, *, also: Any = ()) -> None:
        counts["writes"] += 1
        counts["behind"] += bool(self._flushing or self._side is not None)
        await write(self, changes, undo, also=also)

    persist.Persister.write = counted  # type: ignore[method-assign]
    owner = app.owners[QUEUE]
    perf = time.perf_counter
    samples = []
    try:
        t0 = perf()
        for i in range(jobs):
            t = perf()
            await app.enqueue(QUEUE, {"i": i, "pad": "x" * 70})
            samples.append(perf() - t)
        while owner.state.jobs:  # every job acked (and forgotten)
            await asyncio.sleep(0.0005)
        elapsed = perf() - t0
    finally:
        persist.Persister.write = write  # type: ignore[method-assign]
    return {"enqueue p50 ms": statistics.median(samples) * 1e3, "e2e jobs/s": jobs / elapsed,
            "writes": counts["writes"], "behind": counts["behind"]}


async def run(args: argparse.Namespace) -> None:
    from istos import Istos, RedisStoragePlugin
    from istos.owner.persist import Persister

    cfg_owner, cfg_worker = zenoh_configs(2)
    prefix = f"istos-bench/{secrets.token_hex(6)}"
    store = RedisStoragePlugin(key_prefix=f"istos-bench-{secrets.token_hex(6)}")
    app = Istos(storage=store, zenoh=cfg_owner, prefix=prefix)
    app.queue(QUEUE)
    rows: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    async with app.serving():
        worker = subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(cfg_worker), prefix],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert worker.stdin is not None and worker.stdout is not None
        try:
            if worker.stdout.readline().strip() != "READY":
                raise RuntimeError("the worker did not start")
            await block(app, 200)  # warm up: routes, connections, the worker's claims
            names = list(VARIANTS)
            for r in range(args.rounds):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    for attr, value in VARIANTS[name].items():
                        setattr(Persister, attr, value)
                    row = await block(app, args.jobs)
                    rows[name].append(row)
                    print(f"  round {r + 1} {name}: " + ", ".join(
                        f"{k} {v:,.3f}" if k.endswith("ms") else f"{k} {v:,.0f}"
                        for k, v in row.items()) + f" (1-min load {os.getloadavg()[0]:.2f})",
                        flush=True)
        finally:
            for attr in ("overtake", "hand_over"):
                setattr(Persister, attr, True)
            worker.stdin.write("stop\n")
            worker.stdin.close()
            try:
                worker.wait(20)
            except subprocess.TimeoutExpired:
                worker.kill()
            await store.wipe()
    base = {k: statistics.median(x[k] for x in rows["in order"])
            for k in ("enqueue p50 ms", "e2e jobs/s")}
    print("\n| variant | enqueue p50 ms | e2e jobs/s | e2e / in order | writes behind one |")
    print("|---|---|---|---|---|")
    for name, xs in rows.items():
        p50 = statistics.median(x["enqueue p50 ms"] for x in xs)
        e2e = statistics.median(x["e2e jobs/s"] for x in xs)
        behind = statistics.median(x["behind"] / max(1, x["writes"]) for x in xs)
        print(f"| {name} | {p50:.3f} | {e2e:,.0f} | {e2e / base['e2e jobs/s']:.2f}x | "
              f"{behind:.0%} |")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.durable_overlap")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=2000)
    args = p.parse_args()
    print(f"1-min load at the start {os.getloadavg()[0]:.2f} (a shared machine: read ratios)")
    asyncio.run(run(args))
    print(f"1-min load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
