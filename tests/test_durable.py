"""Write-through, recovery of every job state after an owner restart, storage outages, and HA
election — on the in-process mesh with real Redis / PostgreSQL / SQLite storage."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
from helpers import count, wait_events
from services import free_port, postgres_url, redis_url, start_throwaway_redis

from istos import (
    HAConfigError,
    Istos,
    MemoryStorage,
    RedisStoragePlugin,
    SQLAlchemyStoragePlugin,
    StorageUnavailable,
)
from istos.storage.base import Storage
from istos.transport.local import LocalMesh

StorageFactory = Callable[[], Storage]


@pytest.fixture(params=["memory", "redis", "postgres", "sqlite"])
async def storage_factory(request, tmp_path) -> AsyncIterator[StorageFactory]:
    """A factory of storage handles that all see the same data (one per 'process')."""
    kind = request.param
    made: list[Storage] = []
    if kind == "memory":
        shared = MemoryStorage(durable=True, shared=True)

        def make() -> Storage:
            return shared
    elif kind == "redis":
        url, prefix = redis_url(), f"t-{uuid.uuid4().hex[:10]}"

        def make() -> Storage:
            made.append(RedisStoragePlugin(url, key_prefix=prefix))
            return made[-1]
    elif kind == "postgres":
        url, table = postgres_url(), f"t_{uuid.uuid4().hex[:10]}"

        def make() -> Storage:
            made.append(SQLAlchemyStoragePlugin(url, table=table))
            return made[-1]
    else:
        url = f"sqlite+aiosqlite:///{tmp_path / 'istos.db'}"

        def make() -> Storage:
            made.append(SQLAlchemyStoragePlugin(url))
            return made[-1]
    yield make
    if made:
        cleaner = made[-1]
        await cleaner.open()
        if hasattr(cleaner, "wipe"):
            await cleaner.wipe()
        if kind == "postgres":
            await cleaner.drop_table()
        for s in made:
            await s.close()


def owner_app(mesh: LocalMesh, name: str, storage: Storage, **queue_kw) -> Istos:
    app = Istos(storage=storage, transport=mesh.transport(name))
    app.queue("q", lease_s=30, max_attempts=1, keep_results=True, **queue_kw)
    return app


async def test_restart_recovers_every_job_state(storage_factory):
    mesh = LocalMesh()
    first = owner_app(mesh, "owner-1", storage_factory())
    worker = Istos(transport=mesh.transport("worker"), shutdown_grace_s=0.0)
    hold = asyncio.Event()

    @worker.worker("q", concurrency=4)
    async def handle(job):
        if job["kind"] == "hang":
            await hold.wait()
        if job["kind"] == "fail":
            raise RuntimeError("poison")
        return {"ok": job["kind"]}

    async with first.serving():
        ids = {}
        async with worker.serving():
            for kind in ("done", "fail", "hang"):
                ids[kind] = await first.enqueue("q", {"kind": kind})
            await wait_events(first, lambda ev: count(ev, "acked", ids["done"]) == 1
                              and count(ev, "dead_lettered", ids["fail"]) == 1
                              and count(ev, "claimed", ids["hang"]) == 1)
            worker.kill()  # a crash: the hung job is left to its lease (a stop would release it)
        # worker gone; these two never get claimed
        ids["ready"] = await first.enqueue("q", {"kind": "ready"}, priority=3)
        ids["delayed"] = await first.enqueue("q", {"kind": "delayed"}, delay_s=3600)
    # the first owner is gone; a new one, in "another process", reads the same store
    second = owner_app(mesh, "owner-2", storage_factory())
    async with second.serving():
        owner = second.owners["q"]
        states = {k: owner.state.jobs[j].state for k, j in ids.items()}
        assert states == {"done": "done", "fail": "dead", "hang": "leased", "ready": "ready",
                          "delayed": "delayed"}
        assert await second.result("q", ids["done"]) == {"state": "done",
                                                          "result": {"ok": "done"}}
        (dead,) = await second.dead_letters("q")
        assert dead["job_id"] == ids["fail"] and dead["last_error"] == "RuntimeError: poison"
        hung = owner.state.jobs[ids["hang"]]
        now = second.node.clock.now()
        assert now + 29 < hung.lease_deadline <= now + 30  # a fresh full lease on this clock
        assert owner.state.jobs[ids["ready"]].priority == 3
        assert (await second.result("q", ids["ready"]))["state"] == "ready"


async def test_write_through_happens_before_the_reply(storage_factory):
    mesh = LocalMesh()
    storage = storage_factory()
    app = owner_app(mesh, "owner", storage)
    async with app.serving():
        jid = await app.enqueue("q", {"x": 1})
        probe = storage_factory()
        await probe.open()
        assert await probe.get("jobs:q", jid) is not None  # stored before enqueue returned


@pytest.mark.redis
async def test_storage_outage_refuses_enqueue_and_loses_nothing_accepted():
    port = free_port()
    proc = start_throwaway_redis(port)
    mesh = LocalMesh()
    storage = RedisStoragePlugin(f"redis://127.0.0.1:{port}/0", op_timeout_s=0.5,
                                 connect_timeout_s=0.5)
    app = owner_app(mesh, "owner", storage)
    try:
        async with app.serving():
            accepted = await app.enqueue("q", {"n": 1})
            proc.kill()
            proc.wait(5)
            with pytest.raises(StorageUnavailable):
                await app.enqueue("q", {"n": 2}, job_id="refused")
            owner = app.owners["q"]
            assert "refused" not in owner.state.jobs and accepted in owner.state.jobs
            proc = start_throwaway_redis(port)  # back (empty: no persistence configured)
            again = await app.enqueue("q", {"n": 2}, job_id="refused")
            assert again == "refused" and owner.state.counts["ready"] == 2
    finally:
        proc.kill()
        proc.wait(5)


def test_ha_needs_shared_storage():
    app = Istos(transport=LocalMesh().transport("x"))
    with pytest.raises(HAConfigError, match="shared"):
        app.queue("q", ha=True)


async def test_ha_standby_takes_over_and_serves_recovered_jobs():
    mesh = LocalMesh()
    storage = MemoryStorage(durable=True, shared=True)
    replicas = []
    for name in ("replica-a", "replica-b"):
        app = Istos(storage=storage, transport=mesh.transport(name))
        app.queue("q", ha=True)
        replicas.append(app)
    producer = Istos(transport=mesh.transport("producer"))
    a, b = replicas
    await a.start()
    await asyncio.wait_for(_until(lambda: a.is_active_owner("q")), 2.0)
    await b.start()
    await asyncio.sleep(0)
    assert not b.is_active_owner("q")  # the older replica keeps leading
    async with producer.serving():
        ids = [await producer.enqueue("q", {"i": i}) for i in range(5)]
        await a.stop()  # the leader goes away
        await asyncio.wait_for(_until(lambda: b.is_active_owner("q")), 2.0)
        assert set(b.owners["q"].state.jobs) == set(ids)
        ids.append(await producer.enqueue("q", {"i": 5}))  # producers need no change
        assert len(b.owners["q"].state.jobs) == 6
    await b.stop()


async def _until(pred: Callable[[], bool]) -> None:
    while not pred():
        await asyncio.sleep(0.005)  # leadership is a side effect of a watcher task: poll briefly
