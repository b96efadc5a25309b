"""Bulk and pipelined producers against a remote owner (issue 18).

    python -m bench.bulk [--runs 5] [--jobs 50000] [--batch 10000] [--concurrency 8]
                         [--pipelined 5000] [--only accept,pipelined,e2e,drain]

Two OS processes on a private loopback Zenoh mesh: the **owner** (a child: ``python -m
bench.bulk owner SPEC``, in-memory queues, no worker) and the **producer** (this process), which
also hosts the worker (concurrency 8, no-op handler) for the e2e and drain rows. Jobs are ~100
bytes (``bench/_common.make_job``). Figures are medians of ``--runs`` runs, each on a fresh pair.

- ``accept``: jobs/s accepted by the remote owner from ``app.enqueue_many`` in batches of
  ``--batch`` (timed from the first call to the last reply).
- ``pipelined``: ``--pipelined`` concurrent ``app.enqueue`` calls (asyncio.gather), which the
  client coalesces into one ``enqueue_many`` per event-loop turn.
- ``e2e``: enqueue_many of all jobs while the worker drains; first call to the owner's last ack.
- ``drain``: all jobs queued first, then the worker starts; its start to the last ack.

The owner child reports the last ack of each queue (it counts its ``acked`` events) on its
stdout; the parent timestamps the line, so a figure includes one pipe hop (microseconds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402

from istos import Istos, JobEvent  # noqa: E402
from istos.core.config import WorkerConfig  # noqa: E402
from istos.worker.worker import WorkerRunner  # noqa: E402

WORKLOADS = ("accept", "pipelined", "e2e", "drain")
ACKED_TAG = "@@ACKED "


# -- the owner process ----------------------------------------------------------------------------
async def owner_main(spec: dict[str, Any]) -> None:
    """Serve the queues of ``spec["expect"]`` (queue -> acks to wait for); print one line per
    queue when its last ack is recorded, and stop when the parent writes a line."""
    app = Istos(zenoh=spec["zenoh"], prefix=spec["prefix"], node_id="owner")
    expect: dict[str, int] = spec["expect"]
    for name in expect:
        app.queue(name)
    acked = dict.fromkeys(expect, 0)

    def listener(event: JobEvent) -> None:
        if event.kind == "acked" and event.queue in acked:
            acked[event.queue] += 1
            if acked[event.queue] == expect[event.queue]:
                print(f"{ACKED_TAG}{event.queue}", flush=True)

    async with app.serving():
        app.events.subscribe(listener)
        c.report_ready()
        await c.wait_for_stop_line()


class OwnerProcess:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.proc: asyncio.subprocess.Process | None = None
        self.acked: dict[str, asyncio.Future[float]] = {}
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.acked = {q: loop.create_future() for q in self.spec["expect"]}
        # BENCH_OWNER_PROFILE=PATH: cProfile the owner process into PATH (pstats format).
        prof = os.environ.get("BENCH_OWNER_PROFILE")
        pre = ["-m", "cProfile", "-o", prof] if prof else []
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-u", *pre, "-m", "bench.bulk", "owner", json.dumps(self.spec),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=dict(os.environ))
        assert self.proc.stdout is not None
        await c.read_tagged(self.proc.stdout, c.READY_TAG, 60.0)
        self._reader = loop.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while raw := await self.proc.stdout.readline():
            line = raw.decode().rstrip("\n")
            if line.startswith(ACKED_TAG):
                self.acked[line[len(ACKED_TAG):]].set_result(time.perf_counter())
            else:
                print(f"[owner] {line}", file=sys.stderr)

    async def stop(self) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.returncode is None and proc.stdin is not None:
            proc.stdin.write(b"stop\n")
            await proc.stdin.drain()
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except asyncio.TimeoutError:
                proc.kill()
                await proc.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)


# -- the producer (this process) -------------------------------------------------------------------
async def start_worker(app: Istos, queue: str, concurrency: int) -> WorkerRunner:
    config = WorkerConfig.build(queue, concurrency=concurrency)
    runner = WorkerRunner(config, c.noop_handler, app.node, app.client(queue),
                          shutdown_grace_s=app.shutdown_grace_s)
    app.runners.append(runner)
    await runner.start()
    return runner


async def put_all(app: Istos, queue: str, jobs: int, batch: int) -> None:
    for start in range(0, jobs, batch):
        await app.enqueue_many(queue, [c.make_job(i) for i in range(start,
                                                                     min(jobs, start + batch))])


async def one_run(args: argparse.Namespace) -> dict[str, float]:
    jobs, only = args.jobs, set(args.only.split(","))
    cfg_owner, cfg_producer = c.zenoh_configs(2)
    prefix = c.unique_prefix()
    expect = {"e2e": jobs, "drain": jobs, "accept": 0, "pipelined": 0}
    owner = OwnerProcess({"zenoh": cfg_owner, "prefix": prefix, "expect": expect})
    out: dict[str, float] = {}
    await owner.start()
    try:
        app = Istos(zenoh=cfg_producer, prefix=prefix, node_id="producer",
                    request_timeout_s=30.0)
        async with app.serving():
            await app.client("accept").call("ping", 30.0)  # the owner is reachable
            for name in ("accept", "pipelined"):
                await app.client(name).call("ping", 30.0)
            if "accept" in only:
                t0 = time.perf_counter()
                await put_all(app, "accept", jobs, args.batch)
                out["accept"] = jobs / (time.perf_counter() - t0)
            if "pipelined" in only:
                bodies = [c.make_job(i) for i in range(args.pipelined)]
                t0 = time.perf_counter()
                await asyncio.gather(*(app.enqueue("pipelined", b) for b in bodies))
                out["pipelined"] = args.pipelined / (time.perf_counter() - t0)
            if "e2e" in only:
                await start_worker(app, "e2e", args.concurrency)
                await app.client("e2e").call("ping", 30.0)
                t0 = time.perf_counter()
                await put_all(app, "e2e", jobs, args.batch)
                t1 = await asyncio.wait_for(owner.acked["e2e"], c.deadline_for(jobs))
                out["e2e"] = jobs / (t1 - t0)
            if "drain" in only:
                await put_all(app, "drain", jobs, args.batch)
                t0 = time.perf_counter()
                await start_worker(app, "drain", args.concurrency)
                t1 = await asyncio.wait_for(owner.acked["drain"], c.deadline_for(jobs))
                out["drain"] = jobs / (t1 - t0)
    finally:
        await owner.stop()
    return out


async def main_async(args: argparse.Namespace) -> None:
    runs = []
    for i in range(args.runs):
        figures = await one_run(args)
        print(f"run {i + 1}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in figures.items()),
              file=sys.stderr)
        runs.append(figures)
    load = os.getloadavg()
    print(f"remote owner (own process), {args.jobs:,} jobs of ~100 bytes, enqueue_many batches "
          f"of {args.batch:,}, worker concurrency {args.concurrency}; median of {args.runs} "
          f"runs; load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} "
          "cores")
    targets = {"accept": 50_000, "e2e": 20_000, "drain": 20_000}
    for name in WORKLOADS:
        values = [r[name] for r in runs if name in r]
        if not values:
            continue
        med = statistics.median(values)
        target = targets.get(name)
        verdict = "" if target is None else \
            f"  (target >= {target:,}: {'yes' if med >= target else 'NO'})"
        print(f"{name:>10}: {med:>9,.0f} jobs/s  [min {min(values):,.0f}, max "
              f"{max(values):,.0f}]{verdict}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["owner"]:
        asyncio.run(owner_main(json.loads(argv[1])))
        return
    parser = argparse.ArgumentParser(prog="python -m bench.bulk")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--pipelined", type=int, default=5_000)
    parser.add_argument("--only", default=",".join(WORKLOADS))
    asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
