"""The transactional outbox's costs on PostgreSQL: the write, commit-to-pickup, relay rows/s.

    .venv/bin/python -m bench.outbox [--url postgresql+asyncpg://postgres@127.0.0.1:5432/test]
        [--txns 500] [--jobs 200] [--rows 5000]

``txn``: ``--txns`` transactions one after another, each inserting one row into a bench table
(``plain``) or that row plus ``outbox.enqueue`` of a job (``outbox``), interleaved; per
transaction ``begin`` to ``commit`` returned, p50/p99.

``pickup``: an owner app (queue + worker, in-memory storage), a relay app and a producer app,
each its own Zenoh session on a private loopback mesh, in this process. ``--jobs`` times,
spaced so the worker is idle again: ``outbox`` = commit returned -> handler start (the relay
woken by the commit's NOTIFY; its poll is 60 s), ``enqueue`` = the producer's ``app.enqueue``
called -> handler start (a plain remote enqueue). p50/p99 of each.

``relay``: 1 or 4 relay processes wait on the table, then ``--rows`` rows are committed in one
transaction; rows/s from the commit until the table is empty (the owner, in this process,
stores the jobs in memory; no worker runs). On 2 cores, 4 relays measure claiming in
parallel against one owner, not what 4 machines would gain.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from _common import percentile, zenoh_configs  # noqa: E402

from istos import Istos, outbox  # noqa: E402

Q = "bench/outbox"


def summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {"p50_ms": round(percentile(ms, 50), 3), "p99_ms": round(percentile(ms, 99), 3),
            "n": len(ms)}


async def bench_txn(engine: Any, table: str, txns: int) -> dict[str, Any]:
    from sqlalchemy import Column, Integer, MetaData, String, Table
    from sqlalchemy.ext.asyncio import AsyncSession

    orders = Table(f"{table}_orders", MetaData(), Column("id", Integer, primary_key=True),
                   Column("email", String(255)))
    table = f"{table}_txn"  # its rows are never relayed: an outbox table of its own
    await outbox.create_table(engine, table)
    async with engine.begin() as conn:
        await conn.run_sync(orders.create)
    times: dict[str, list[float]] = {"plain": [], "outbox": []}
    try:
        async with AsyncSession(engine) as session:
            for i in range(txns * 2):
                kind = "plain" if i % 2 else "outbox"
                t0 = time.perf_counter()
                async with session.begin():
                    await session.execute(orders.insert(), {"email": f"u{i}@example.com"})
                    if kind == "outbox":
                        await outbox.enqueue(session, Q, {"i": i, "pad": "x" * 78},
                                             table=table)
                times[kind].append(time.perf_counter() - t0)
    finally:
        async with engine.begin() as conn:
            await conn.run_sync(orders.drop)
        await outbox.drop_table(engine, table)
    return {k: summary(v) for k, v in times.items()}


async def bench_pickup(engine: Any, url: str, table: str, jobs: int) -> dict[str, Any]:
    from sqlalchemy.ext.asyncio import AsyncSession

    configs = zenoh_configs(3)
    prefix = f"istos-bench/{uuid.uuid4().hex[:12]}"
    owner = Istos(zenoh=configs[0], prefix=prefix)
    owner.queue(Q)
    started: asyncio.Queue[tuple[Any, float]] = asyncio.Queue()

    @owner.worker(Q, concurrency=1, poll_interval_s=5.0)
    async def work(job: Any) -> None:
        started.put_nowait((job.get("i"), time.perf_counter()))

    async def start_of(i: int) -> float:
        got, at = await started.get()
        assert got == i, f"job {got} started when job {i} was awaited"
        return at

    relay_app = Istos(zenoh=configs[1], prefix=prefix)
    relay_app.outbox_relay(url, table=table, poll_s=60)
    producer = Istos(zenoh=configs[2], prefix=prefix)
    out: dict[str, list[float]] = {"outbox": [], "enqueue": []}
    async with owner.serving(), relay_app.serving(), producer.serving():
        await producer.enqueue(Q, {"warm": 1})  # routes and sessions warm
        await start_of(None)  # type: ignore[arg-type]
        async with AsyncSession(engine) as session:
            for i in range(jobs * 2):
                await asyncio.sleep(0.02)  # the worker is idle (parked) again
                if i % 2:
                    t0 = time.perf_counter()
                    await producer.enqueue(Q, {"i": i})
                    out["enqueue"].append(await start_of(i) - t0)
                else:
                    async with session.begin():
                        await outbox.enqueue(session, Q, {"i": i}, table=table)
                    t0 = time.perf_counter()
                    out["outbox"].append(await start_of(i) - t0)
    return {k: summary(v) for k, v in out.items()}


async def bench_relay(engine: Any, url: str, table: str, rows: int, relays: int) -> float:
    """Rows/s of ``relays`` relay processes draining ``rows`` rows committed at once."""
    import subprocess

    from sqlalchemy import func, select
    from sqlalchemy.ext.asyncio import AsyncSession

    configs = zenoh_configs(1 + relays)
    prefix = f"istos-bench/{uuid.uuid4().hex[:12]}"
    owner = Istos(zenoh=configs[0], prefix=prefix)
    owner.queue(Q)
    t = outbox.outbox_table(table)
    procs = [subprocess.Popen([sys.executable, str(BENCH / "_outbox_relay.py"), json.dumps(c),
                               prefix, url, table], stdout=subprocess.PIPE, text=True)
             for c in configs[1:]]
    try:
        async with owner.serving():
            for p in procs:
                assert p.stdout is not None
                line = await asyncio.wait_for(asyncio.to_thread(p.stdout.readline), 60)
                assert "@@READY" in line, line
            async with AsyncSession(engine) as session, session.begin():
                for i in range(rows):
                    await outbox.enqueue(session, Q, {"i": i, "pad": "x" * 78}, table=table)
            t0 = time.perf_counter()  # the commit: every relay is woken by its NOTIFY
            async with engine.connect() as conn:
                while (await conn.execute(select(func.count()).select_from(t))).scalar_one():
                    await asyncio.sleep(0.002)
            return rows / (time.perf_counter() - t0)
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)


async def main() -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="postgresql+asyncpg://postgres@127.0.0.1:5432/test")
    ap.add_argument("--txns", type=int, default=500)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--rows", type=int, default=5000)
    args = ap.parse_args()
    engine = create_async_engine(args.url)
    table = f"bench_ob_{uuid.uuid4().hex[:10]}"
    await outbox.create_table(engine, table)
    result: dict[str, Any] = {}
    try:
        result["txn"] = await bench_txn(engine, table, args.txns)
        result["pickup"] = await bench_pickup(engine, args.url, table, args.jobs)
        result["relay_rows_per_s"] = {
            str(k): round(await bench_relay(engine, args.url, table, args.rows, k))
            for k in (1, 4)}
    finally:
        await outbox.drop_table(engine, table)
        await engine.dispose()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
