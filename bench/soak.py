"""Owner memory and CPU under producer-session churn, then a long mixed load (issue 24, item 4).

    .venv/bin/python -m bench.soak [--sessions 10] [--jobs 20000] [--duration 3600]
                                   [--every 60] [--zenoh-shm]

The owner (in-memory storage, nothing kept: every job acked, no results) and one worker
(concurrency 8) run in processes of their own on a private loopback mesh. Phase 1: ``--sessions``
producer sessions one after another, each opens, pushes ``--jobs`` jobs with raw
``enqueue_many`` calls of 500 and closes; after each the bench waits until the queue is drained
and prints the owner's RSS and CPU time. Target: after the second session, RSS grows by at most
10 MB over the remaining ones. Phase 2, for ``--duration`` seconds: one long-lived producer
enqueues (single jobs and batches of 50), the worker claims and acks, a follower streams the
queue's events, and ``istos stats`` runs as a CLI process every 10 s; the owner's RSS and CPU
are printed every ``--every`` seconds. ``--zenoh-shm`` turns Zenoh's shared-memory transport
back on in every process (to see the growth it causes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import unique_prefix, zenoh_configs  # noqa: E402

QUEUE = "soak"
TARGET_MB = 10.0


def proc_figures(pid: int) -> tuple[float, float]:
    """(RSS in MB, user + system CPU seconds) of process ``pid``, from /proc."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return rss, cpu


# -- the owner and worker processes -------------------------------------------------------------
async def serve(role: str, config: dict[str, Any], prefix: str) -> None:
    from istos import Istos

    app = Istos(zenoh=config, prefix=prefix, node_id=f"soak-{role}")
    if role == "owner":
        app.queue(QUEUE, lease_s=30.0)
    else:
        @app.worker(QUEUE, concurrency=8)
        async def work(job: Any) -> None:
            return None

    async with app.serving():
        print("READY", flush=True)
        await asyncio.Event().wait()


def start(role: str, config: dict[str, Any], prefix: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, __file__, "--serve", role, json.dumps(config),
                             prefix], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != "READY":
        raise SystemExit(f"{role} did not start: {line!r}")
    return proc


# -- phase 1: producer sessions that come and go --------------------------------------------------
async def drained(monitor: Any, timeout_s: float = 600.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        counts = (await monitor.client(QUEUE).call("stats"))["stats"]["counts"]
        if counts["ready"] == 0 and counts["leased"] == 0 and counts["delayed"] == 0:
            return
        await asyncio.sleep(0.5)  # a bench polling the owner's own counts
    raise SystemExit("the queue did not drain")


async def one_session(config: dict[str, Any], prefix: str, jobs: int) -> None:
    from istos import Istos

    producer = Istos(zenoh=config, prefix=prefix, node_id=f"soak-producer-{time.monotonic_ns()}")
    async with producer.serving():
        for start_at in range(0, jobs, 500):
            items = [{"i": i, "pad": "x" * 20} for i in range(start_at, min(jobs, start_at + 500))]
            await producer.enqueue_many(QUEUE, items)


async def phase_one(args: argparse.Namespace, cfgs: list[dict[str, Any]], prefix: str,
                    owner_pid: int, monitor: Any) -> list[float]:
    rss0, _ = proc_figures(owner_pid)
    print(f"owner RSS before any session: {rss0:.1f} MB")
    print("session   jobs  owner RSS MB  owner CPU s  took s")
    series = []
    for s in range(args.sessions):
        started = time.perf_counter()
        await one_session(cfgs[3 + s], prefix, args.jobs)
        await drained(monitor)
        await asyncio.sleep(1.0)  # let the closed session's link teardown finish
        rss, cpu = proc_figures(owner_pid)
        series.append(rss)
        print(f"{s + 1:>7}  {args.jobs:>5}  {rss:>12.1f}  {cpu:>11.1f}  "
              f"{time.perf_counter() - started:>6.1f}", flush=True)
    if len(series) >= 3:
        growth = series[-1] - series[1]
        verdict = "OK" if growth <= TARGET_MB else "NO"
        print(f"RSS growth after the second session: {growth:+.1f} MB over "
              f"{len(series) - 2} sessions (target <= {TARGET_MB:g} MB): {verdict}")
    return series


# -- phase 2: the mixed load ----------------------------------------------------------------------
async def phase_two(args: argparse.Namespace, cfgs: list[dict[str, Any]], prefix: str,
                    owner_pid: int, producer: Any) -> None:
    from istos_nb import aattach

    follower = await aattach(QUEUE, cfgs[3 + args.sessions], prefix=prefix)
    follower.follow()
    stop_at = time.monotonic() + args.duration
    cli_cfg = json.dumps(cfgs[-1])

    async def enqueue_load() -> None:
        i = 0
        while time.monotonic() < stop_at:
            if i % 20 == 0:
                await producer.enqueue_many(QUEUE, [{"b": i, "k": k} for k in range(50)])
            else:
                await producer.enqueue(QUEUE, {"i": i})
            i += 1
            await asyncio.sleep(0.01)  # about 100 requests a second: a steady load, not a flood

    async def cli_calls() -> None:
        while time.monotonic() < stop_at:
            await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "istos.ops.cli", "stats", QUEUE,
                                 "--zenoh", cli_cfg, "--prefix", prefix, "--json"],
                capture_output=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=60)
            await asyncio.sleep(10.0)

    async def report() -> None:
        began = time.monotonic()
        print("\nmixed load:   t s  owner RSS MB  owner CPU s")
        while time.monotonic() < stop_at:
            rss, cpu = proc_figures(owner_pid)
            print(f"          {time.monotonic() - began:>5.0f}  {rss:>12.1f}  {cpu:>11.1f}",
                  flush=True)
            await asyncio.sleep(min(args.every, max(0.0, stop_at - time.monotonic())))
        rss, cpu = proc_figures(owner_pid)
        print(f"          {time.monotonic() - began:>5.0f}  {rss:>12.1f}  {cpu:>11.1f}")

    try:
        await asyncio.gather(enqueue_load(), cli_calls(), report())
    finally:
        await asyncio.to_thread(follower.close)


async def main(args: argparse.Namespace) -> None:
    from istos import Istos

    # owner, worker, monitor (also the long-lived producer), one per producer session,
    # follower, CLI: every one connects to the owner only (closed sessions leave no endpoint
    # behind that a later one would try to reach)
    cfgs = zenoh_configs(3 + args.sessions + 2)
    for cfg in cfgs[1:]:
        cfg["connect"] = {"endpoints": cfgs[0]["listen"]["endpoints"]}
    if args.zenoh_shm:
        for cfg in cfgs:
            cfg["transport"] = {"shared_memory": {"enabled": True}}
    prefix = unique_prefix()
    owner = start("owner", cfgs[0], prefix)
    worker = start("worker", cfgs[1], prefix)
    monitor = Istos(zenoh=cfgs[2], prefix=prefix, node_id="soak-monitor")
    try:
        async with monitor.serving():
            await phase_one(args, cfgs, prefix, owner.pid, monitor)
            if args.duration > 0:
                await phase_two(args, cfgs, prefix, owner.pid, monitor)
    finally:
        for proc in (owner, worker):
            proc.kill()
            proc.wait(10)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        asyncio.run(serve(sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=10)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--duration", type=float, default=3600.0,
                        help="seconds of mixed load after the sessions (0: none)")
    parser.add_argument("--every", type=float, default=60.0,
                        help="seconds between figures during the mixed load")
    parser.add_argument("--zenoh-shm", action="store_true",
                        help="Zenoh's shared-memory transport on (Istos turns it off)")
    asyncio.run(main(parser.parse_args()))
