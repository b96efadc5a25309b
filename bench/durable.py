"""Durable storage cost: enqueue and ack at backlogs of 100, 10k and 100k jobs on Redis and
PostgreSQL (must stay flat within 2x), and end-to-end throughput durable vs in memory, plus
Redis with ``ha=True`` (one replica, so it leads: every write carries its fencing epoch).

    python -m bench.durable [--runs 5] [--backlogs 100,10000,100000] [--ops 300]
                            [--e2e-jobs 2000] [--twoproc-only]

The last table runs the worker in its own process (``bench/_driver_ours.py worker``) over a
private loopback Zenoh mesh, the owner (with the store) and a concurrent producer in this one:
the issue-18 setting (targets: Redis >= 6,000, PostgreSQL >= 3,000 jobs/s).

Backlogs are built by writing records straight through the owner's storage namespace (as an
owner restart would find them), then the owner recovers them; the timed operations go through
the owner's real request path on an in-process app (no network hop), so the figures are the
owner's cost per call including its write-through round trips.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

from istos import Istos, MemoryStorage, RedisStoragePlugin, SQLAlchemyStoragePlugin
from istos.core.records import encode_record
from istos.core.state import JobRecord
from istos.transport.local import LocalMesh

DRIVER = Path(__file__).resolve().parent / "_driver_ours.py"
sys.path.insert(0, str(DRIVER.parent))  # bench/_common.py and the worker driver import flat
REDIS = "redis://127.0.0.1:6379/0"
POSTGRES = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"


def make_storage(kind: str, tag: str):
    if kind == "redis":
        return RedisStoragePlugin(REDIS, key_prefix=tag)
    if kind == "postgres":
        return SQLAlchemyStoragePlugin(POSTGRES, table=tag.replace("-", "_"))
    return MemoryStorage()


async def cleanup(storage, kind: str, tag: str) -> None:
    await storage.open()  # the app closed it when it stopped serving
    if kind == "redis":
        await storage.wipe()
    elif kind == "postgres":
        await storage.drop_table()


async def seed_backlog(storage, n: int) -> None:
    batch = []
    for i in range(n):
        rec = JobRecord(job_id=f"seed-{i}", queue="q", body=b"\x81\xa1x" + b"y" * 96,
                        priority=0, enqueued_at=0.0, ready_at=0.0)
        batch.append((rec.job_id, encode_record(rec)))
        if len(batch) == 1000:
            await storage.put_many("jobs:q", batch)
            batch = []
    if batch:
        await storage.put_many("jobs:q", batch)


async def per_op_cost(kind: str, backlog: int, ops: int) -> dict[str, float]:
    tag = f"bench-{uuid.uuid4().hex[:8]}"
    storage = make_storage(kind, tag)
    await storage.open()
    try:
        await seed_backlog(storage, backlog)
        if kind == "postgres":
            # The backlog appeared in one burst; autovacuum would analyze the table shortly
            # after, and until then the planner, believing it empty, scans it on every delete.
            from sqlalchemy import text
            async with storage._engine.begin() as conn:
                await conn.execute(text(f"ANALYZE {tag.replace('-', '_')}"))
        app = Istos(storage=storage, transport=LocalMesh().transport("bench"))
        app.queue("q", lease_s=600)
        async with app.serving():
            owner = app.owners["q"]
            assert len(owner.state.jobs) == backlog
            body = b"\x81\xa1x" + b"y" * 96
            t0 = time.perf_counter()
            for i in range(ops):
                await owner.dispatch({"v": 1, "op": "enqueue", "body": body,
                                      "job_id": f"new-{i}"})
            enq = (time.perf_counter() - t0) / ops
            claimed = await owner.dispatch({"v": 1, "op": "claim",
                                            "workers": [f"w#{i}" for i in range(ops)]})
            t0 = time.perf_counter()
            for job in claimed["jobs"]:
                await owner.dispatch({"v": 1, "op": "ack", "job_id": job["job_id"],
                                      "token": job["token"]})
            ack = (time.perf_counter() - t0) / len(claimed["jobs"])
        return {"enqueue_us": enq * 1e6, "ack_us": ack * 1e6}
    finally:
        await cleanup(storage, kind, tag)
        await storage.close()


async def end_to_end(kind: str, jobs: int) -> float:
    tag = f"bench-{uuid.uuid4().hex[:8]}"
    ha = kind.endswith("-ha")
    kind = kind.removesuffix("-ha")
    storage = make_storage(kind, tag)
    mesh = LocalMesh()
    app = Istos(storage=storage, transport=mesh.transport("owner"))
    app.queue("q", ha=ha)
    done = asyncio.Event()
    count = 0

    @app.worker("q", concurrency=8)
    async def work(job):
        nonlocal count
        count += 1
        if count == jobs:
            done.set()

    try:
        async with app.serving():
            while not app.is_active_owner("q"):  # an HA replica leads once elected
                await asyncio.sleep(0.01)
            t0 = time.perf_counter()
            await asyncio.gather(*(app.enqueue("q", {"i": i}) for i in range(jobs)))
            await asyncio.wait_for(done.wait(), 300)
            return jobs / (time.perf_counter() - t0)
    finally:
        await cleanup(storage, kind, tag)
        await storage.close()


async def end_to_end_twoproc(kind: str, jobs: int, concurrency: int = 8) -> float:
    """Owner (with ``kind`` storage) and producer in this process, the worker in another
    (``bench/_driver_ours.py worker``), over a private loopback Zenoh mesh; jobs/s from the
    first enqueue to the owner's last ``acked`` event."""
    import _common as c
    from _driver_ours import QUEUE

    tag = f"bench-{uuid.uuid4().hex[:8]}"
    ha = kind.endswith("-ha")
    kind = kind.removesuffix("-ha")
    storage = make_storage(kind, tag)
    cfg_owner, cfg_worker = c.zenoh_configs(2)
    prefix = c.unique_prefix()
    app = Istos(storage=storage, zenoh=cfg_owner, prefix=prefix)
    app.queue(QUEUE, ha=ha)
    done = c.Completion(jobs)
    app.events.subscribe(lambda event: done.hit() if event.kind == "acked" else None)
    try:
        async with app.serving():
            while not app.is_active_owner(QUEUE):  # an HA replica leads once elected
                await asyncio.sleep(0.01)
            child = c.WorkerProcess(str(DRIVER), {"zenoh": cfg_worker, "prefix": prefix,
                                                  "concurrency": concurrency})
            try:
                await child.start()
                t0 = time.perf_counter()
                await asyncio.gather(*(app.enqueue(QUEUE, c.make_job(i)) for i in range(jobs)))
                t1 = await done.wait(c.deadline_for(jobs))
                await child.stop()
            finally:
                await child.kill()
            return jobs / (t1 - t0)
    finally:
        await cleanup(storage, kind, tag)
        await storage.close()


async def main_async(args: argparse.Namespace) -> None:
    if args.twoproc_only:
        await print_twoproc(args)
        return
    backlogs = [int(x) for x in args.backlogs.split(",")]
    print(f"owner cost per call with write-through (median of {args.runs} runs, "
          f"{args.ops} ops each)")
    print(f"{'store':>9} {'backlog':>8} {'enqueue us':>11} {'ack us':>8}")
    for kind in ("redis", "postgres"):
        rows = []
        for backlog in backlogs:
            samples = [await per_op_cost(kind, backlog, args.ops) for _ in range(args.runs)]
            enq = statistics.median(s["enqueue_us"] for s in samples)
            ack = statistics.median(s["ack_us"] for s in samples)
            rows.append((enq, ack))
            print(f"{kind:>9} {backlog:>8} {enq:>11.0f} {ack:>8.0f}")
        enqs, acks = [r[0] for r in rows], [r[1] for r in rows]
        print(f"{kind:>9} spread (max/min): enqueue {max(enqs) / min(enqs):.2f}x, "
              f"ack {max(acks) / min(acks):.2f}x (target <= 2x)")
    print(f"\nend to end, one process, concurrency 8, {args.e2e_jobs} jobs (median of "
          f"{args.runs})")
    base = None
    for kind in ("memory", "redis", "redis-ha", "postgres"):
        rate = statistics.median([await end_to_end(kind, args.e2e_jobs)
                                  for _ in range(args.runs)])
        base = base or rate
        print(f"{kind:>9}: {rate:8.0f} jobs/s ({rate / base:.2f}x in-memory)")
    await print_twoproc(args)


async def print_twoproc(args: argparse.Namespace) -> None:
    print(f"\nend to end, owner+producer and worker in two processes (Zenoh), concurrency 8, "
          f"{args.e2e_jobs} jobs (median of {args.runs}; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())})")
    targets = {"redis": 6000, "postgres": 3000}
    for kind in ("memory", "redis", "redis-ha", "postgres"):
        rates = [await end_to_end_twoproc(kind, args.e2e_jobs) for _ in range(args.runs)]
        rate = statistics.median(rates)
        target = targets.get(kind)
        verdict = "" if target is None else \
            f"  (target >= {target:,}: {'yes' if rate >= target else 'NO'})"
        print(f"{kind:>9}: {rate:8.0f} jobs/s [min {min(rates):.0f}, max {max(rates):.0f}]"
              f"{verdict}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--backlogs", default="100,10000,100000")
    parser.add_argument("--ops", type=int, default=300)
    parser.add_argument("--e2e-jobs", type=int, default=2000)
    parser.add_argument("--twoproc-only", action="store_true",
                        help="only the two-process end-to-end rows")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
