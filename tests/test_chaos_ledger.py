"""Chaos on real processes, counted from a side-effect ledger.

Owners, HA replicas and workers are OS processes (``procs/ledger_node.py``); the store is a
redis-server (append-only, fsync always) or a PostgreSQL cluster that the test starts itself on
a private port and SIGKILLs / restarts. Workers fsync one ledger line per finished job before
acking it. Every test counts, over the jobs it enqueued (accepted):

- done: jobs with at least one ledger line; duplicated: extra lines (at-least-once allows them);
- stranded: accepted, not done, still held in storage at the end (nobody ran them);
- lost: accepted, not done, and gone from storage.

and asserts 0 lost and 0 stranded, and no dead letters (no fault here may burn an attempt).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import msgpack
import pytest
from services import PrivatePostgres, free_port, start_throwaway_redis
from test_chaos import Proc, mesh_configs, produce

from istos import Istos, RedisStoragePlugin, SQLAlchemyStoragePlugin
from istos.storage.base import Storage

NODE = str(Path(__file__).parent / "procs" / "ledger_node.py")
pytestmark = pytest.mark.slow


class Store:
    """A private store process: start, SIGKILL, restart on the same data."""

    def __init__(self, kind: str, tmp: Path) -> None:
        self.kind = kind
        self.tmp = tmp
        self.ns = f"led_{uuid.uuid4().hex[:8]}"
        self.pg: PrivatePostgres | None = None
        self.port = free_port()
        self.proc = None
        if kind == "postgres":
            self.pg = PrivatePostgres()

    @property
    def url(self) -> str:
        if self.pg is not None:
            return self.pg.url
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        if self.pg is not None:
            self.pg.start()
        else:
            self.proc = start_throwaway_redis(self.port, str(self.tmp))

    def kill(self) -> None:
        if self.pg is not None:
            self.pg.kill()
        elif self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def remove(self) -> None:
        self.kill()
        if self.pg is not None:
            self.pg.remove()

    def client(self) -> Storage:
        if self.pg is not None:
            return SQLAlchemyStoragePlugin(self.url, table=self.ns)
        return RedisStoragePlugin(self.url, key_prefix=self.ns)


@pytest.fixture(params=["redis", "postgres"])
async def store(request, tmp_path) -> AsyncIterator[Store]:
    s = Store(request.param, tmp_path)
    s.start()
    yield s
    s.remove()


@pytest.fixture
async def redis_store(tmp_path) -> AsyncIterator[Store]:
    s = Store("redis", tmp_path)
    s.start()
    yield s
    s.remove()


@pytest.fixture
async def postgres_store(tmp_path) -> AsyncIterator[Store]:
    s = Store("postgres", tmp_path)
    s.start()
    yield s
    s.remove()


@dataclass
class Tally:
    accepted: int
    done: int
    duplicated: int
    stranded: int
    lost: int
    dead: int

    def __str__(self) -> str:
        return (f"accepted {self.accepted}, done {self.done}, duplicated {self.duplicated}, "
                f"stranded {self.stranded}, lost {self.lost}, dead {self.dead}")


def ledger_lines(ledgers: list[Path]) -> list[int]:
    out = []
    for path in ledgers:
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    out.append(json.loads(line)["i"])
                except ValueError:
                    pass  # a line torn by SIGKILL before its fsync
    return out


async def tally(store: Store, ledgers: list[Path], accepted: int) -> Tally:
    lines = ledger_lines(ledgers)
    done = set(lines) & set(range(accepted))
    client = store.client()
    try:
        await client.open()
        records = {k: msgpack.unpackb(v, raw=False) for k, v in await client.scan("jobs:q")}
    finally:
        await client.close()
    held = {r["job_id"] for r in records.values() if r["state"] != "dead"}
    missing = {f"job-{i}" for i in range(accepted)} - {f"job-{i}" for i in done}
    return Tally(accepted, len(done), len(lines) - len(set(lines)), len(missing & held),
                 len(missing - set(records)), sum(r["state"] == "dead" for r in records.values()))


async def wait_done(ledgers: list[Path], jobs: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while len(set(ledger_lines(ledgers)) & set(range(jobs))) < jobs:
        if time.monotonic() > deadline:
            return  # the tally reports what is missing
        await asyncio.sleep(0.1)  # workers report through files: poll with a bound


def node(role: str, config: dict, prefix: str, store: Store, out: Path | None = None) -> Proc:
    return Proc(role, config, prefix, store.url, store.ns, out, node=NODE)


def check(t: Tally, label: str) -> None:
    print(f"\n{label}: {t}")
    assert t.lost == 0 and t.stranded == 0 and t.dead == 0, str(t)
    assert t.done == t.accepted


async def test_frozen_ha_leader_is_harmless(redis_store, tmp_path):
    """SIGSTOP the leader: the standby takes over after the storage lease; SIGCONT: the old
    leader steps down and every job runs (counted here). That it answers nothing from its stale
    memory meanwhile is seen by tests/test_sim_guarantees.py and tests/test_chaos_pg_hold.py
    (probes that fail when the lapsed-leader check is disabled)."""
    configs, prefix = mesh_configs(4), f"frz-{uuid.uuid4().hex[:8]}"
    replicas = [node("replica", configs[i], prefix, redis_store) for i in range(2)]
    ledger = tmp_path / "ledger.jsonl"
    worker = node("worker", configs[2], prefix, redis_store, ledger)
    producer = Istos(zenoh=configs[3], prefix=prefix, node_id="producer", request_timeout_s=2.0)
    try:
        replicas[0].start()
        await replicas[0].expect("LEADING", 30)
        replicas[1].start()
        await replicas[1].expect("STANDBY", 30)
        worker.start()
        await worker.ready()
        async with producer.serving():
            await produce(producer, 50)
            await wait_done([ledger], 50, 30)
            assert replicas[0].proc is not None
            replicas[0].proc.send_signal(signal.SIGSTOP)
            frozen_at = time.monotonic()
            await replicas[1].expect("LEADING", 20)
            takeover_s = time.monotonic() - frozen_at
            await asyncio.wait_for(produce_range(producer, 50, 150), 60)
            replicas[0].proc.send_signal(signal.SIGCONT)
            await replicas[0].expect("STANDBY", 20)
            await wait_done([ledger], 150, 40)
            assert replicas[1].last_role == "LEADING"
    finally:
        for p in (*replicas, worker):
            if p.proc is not None and p.proc.poll() is None:
                p.proc.send_signal(signal.SIGCONT)
            p.kill()
    check(await tally(redis_store, [ledger], 150), f"SIGSTOP leader (takeover {takeover_s:.2f} s)")


async def produce_range(app: Istos, start: int, stop: int) -> None:
    for i in range(start, stop):
        while True:
            try:
                await app.enqueue("q", {"i": i}, job_id=f"job-{i}", timeout_s=2.0)
                break
            except Exception:
                await asyncio.sleep(0.05)


async def test_store_sigkilled_mid_run(store, tmp_path, monkeypatch):
    """The store dies while jobs flow and comes back 1.5 s later (same data). With only 2
    attempts per job, an outage that burned attempts would dead-letter jobs."""
    monkeypatch.setenv("ISTOS_MAX_ATTEMPTS", "2")
    configs, prefix = mesh_configs(4), f"sk-{uuid.uuid4().hex[:8]}"
    owner = node("owner", configs[0], prefix, store)
    ledgers = [tmp_path / f"w{i}.jsonl" for i in range(2)]
    workers = [node("worker", configs[1 + i], prefix, store, ledgers[i]) for i in range(2)]
    producer = Istos(zenoh=configs[3], prefix=prefix, node_id="producer", request_timeout_s=2.0)
    jobs = 400
    try:
        for p in (owner, *workers):
            p.start()
        await asyncio.gather(*(p.ready() for p in (owner, *workers)))
        async with producer.serving():
            feeding = asyncio.create_task(produce(producer, jobs))
            while len(ledger_lines(ledgers)) < jobs // 4:
                await asyncio.sleep(0.05)
            store.kill()
            await asyncio.sleep(1.5)
            store.start()
            await asyncio.wait_for(feeding, 90)
            await wait_done(ledgers, jobs, 60)
    finally:
        for p in (owner, *workers):
            p.kill()
    check(await tally(store, ledgers, jobs), f"store SIGKILL ({store.kind})")


async def test_kill9_storm_on_ha_replicas_and_workers(postgres_store, tmp_path):
    """kill -9 of random replicas (leader or not) and workers, each restarted at once."""
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "12")))
    configs, prefix = mesh_configs(5), f"st-{uuid.uuid4().hex[:8]}"
    replicas = [node("replica", configs[i], prefix, postgres_store) for i in range(2)]
    ledgers = [tmp_path / f"w{i}.jsonl" for i in range(2)]
    workers = [node("worker", configs[2 + i], prefix, postgres_store, ledgers[i])
               for i in range(2)]
    producer = Istos(zenoh=configs[4], prefix=prefix, node_id="producer", request_timeout_s=2.0)
    jobs, kills = 400, 0
    procs = [*replicas, *workers]
    try:
        replicas[0].start()
        await replicas[0].expect("LEADING", 30)
        for p in procs[1:]:
            p.start()
        await asyncio.gather(*(p.ready() for p in procs[1:]))
        async with producer.serving():
            feeding = asyncio.create_task(produce(producer, jobs))
            for _ in range(6):
                await asyncio.sleep(rng.uniform(0.3, 1.0))
                victim = rng.choice(procs)
                victim.kill()
                kills += 1
                victim.start()
                await victim.ready()
            await asyncio.wait_for(feeding, 90)
            await wait_done(ledgers, jobs, 60)
    finally:
        for p in procs:
            p.kill()
    check(await tally(postgres_store, ledgers, jobs), f"kill -9 storm ({kills} kills)")
