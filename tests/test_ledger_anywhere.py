"""``app.idempotent(...)`` needs only storage: it works on apps that never serve, and after
``serving()`` has ended, on memory storage and on a real Redis (unique key prefix)."""

from __future__ import annotations

import asyncio
import socket
import uuid

import pytest
from services import redis_url

from istos import Istos, MemoryStorage
from istos.clock import ManualClock
from istos.errors import StorageUnavailable
from istos.transport.local import LocalMesh

BOUND_S = 20.0


async def test_memory_ledger_without_serving() -> None:
    clock = ManualClock()
    app = Istos(clock=clock)  # no transport at all: it is never needed
    async with app.idempotent("charge:1", ttl_s=60) as first:
        assert first is True
        assert await app.ledger_status("charge:1") == "in_progress"
    async with app.idempotent("charge:1", ttl_s=60) as first:
        assert first is False
    assert await app.ledger_status("charge:1") == "done"
    clock.t += 61
    assert await app.ledger_purge() == 1
    assert await app.ledger_status("charge:1") is None
    assert app.node.transport is None  # nothing started a mesh session


async def test_ledger_records_outlive_serving_on_shared_storage() -> None:
    storage = MemoryStorage(shared=True)
    mesh = LocalMesh()
    server = Istos(storage=storage, transport=mesh.transport("server"))
    async with server.serving():
        async with server.idempotent("order:9") as first:
            assert first
    # After serving ended, and from a second app that never serves, the key stays done.
    script = Istos(storage=storage)
    for app in (server, script):
        async with app.idempotent("order:9") as first:
            assert first is False
    async with script.idempotent("order:10") as first:
        assert first is True
    async with server.serving():
        assert await server.ledger_status("order:10") == "done"


@pytest.mark.redis
async def test_redis_ledger_without_serving_admits_one_of_many_racers() -> None:
    from istos.storage.redis import RedisStoragePlugin

    url, prefix = redis_url(), f"istos-test-ledger-{uuid.uuid4().hex}"
    apps = [Istos(storage=RedisStoragePlugin(url, key_prefix=prefix)) for _ in range(3)]
    firsts: list[bool] = []

    async def attempt(app: Istos) -> None:
        async with app.idempotent("charge:7") as first:
            firsts.append(first)
            await asyncio.sleep(0.01)  # stay inside so the others race a live claim

    try:
        await asyncio.wait_for(asyncio.gather(*(attempt(a) for a in apps for _ in range(4))),
                               BOUND_S)
        assert sorted(firsts) == [False] * 11 + [True]
        assert await apps[2].ledger_status("charge:7") == "done"
        # A serving app on the same storage sees the record written by non-serving ones.
        mesh = LocalMesh()
        serving = Istos(storage=RedisStoragePlugin(url, key_prefix=prefix),
                        transport=mesh.transport("s"))
        async with serving.serving():
            async with serving.idempotent("charge:7") as first:
                assert first is False
    finally:
        for app in apps:
            await app.node.storage.close()
        cleaner = RedisStoragePlugin(url, key_prefix=prefix)
        await cleaner.wipe()
        await cleaner.close()


@pytest.mark.redis
async def test_unreachable_storage_is_a_typed_error_and_claims_nothing() -> None:
    from istos.storage.redis import RedisStoragePlugin

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = Istos(storage=RedisStoragePlugin(f"redis://127.0.0.1:{port}/0",
                                           key_prefix="istos-test-down", connect_timeout_s=0.5))
    entered = False
    with pytest.raises(StorageUnavailable, match="Redis"):
        async with app.idempotent("charge:1"):
            entered = True
    assert not entered
    await app.node.storage.close()
