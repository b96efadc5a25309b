"""Storage adapters: the shared contract on every backend, plus outage, recovery and config.

Redis and PostgreSQL tests use the local services (see ``services.py``): skipped locally when
absent, failed in CI. Each Redis test uses its own key prefix and each test module its own
PostgreSQL table, so parallel runs never collide.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from services import drop_postgres_table, free_port, postgres_url, reachable, redis_url
from storage_contract import MakeStorage, StorageContract

from istos.errors import ConfigError, StorageUnavailable
from istos.storage.base import Storage
from istos.storage.memory import MemoryStorage
from istos.storage.redis import RedisStoragePlugin
from istos.storage.sqlalchemy import SQLAlchemyStoragePlugin

# Generous against a slow CI box, tight against a retry loop that sleeps for seconds.
OUTAGE_BOUND_S = 5.0


class _Opened:
    """Hands out opened adapters and closes every one of them at teardown."""

    def __init__(self) -> None:
        self.instances: list[Storage] = []

    async def add(self, storage: Storage) -> Storage:
        await storage.open()
        self.instances.append(storage)
        return storage

    async def close_all(self) -> None:
        for storage in self.instances:
            await storage.close()


# -- the contract on each backend -------------------------------------------------------------


@pytest.mark.fast
class TestMemoryContract(StorageContract):
    @pytest.fixture
    async def make_storage(self) -> AsyncIterator[MakeStorage]:
        opened = _Opened()
        yield lambda: opened.add(MemoryStorage())
        await opened.close_all()


@pytest.mark.redis
class TestRedisContract(StorageContract):
    @pytest.fixture
    async def make_storage(self) -> AsyncIterator[MakeStorage]:
        url = redis_url()
        prefix = f"istos-test-{uuid.uuid4().hex}"
        opened = _Opened()
        yield lambda: opened.add(RedisStoragePlugin(url, key_prefix=prefix))
        cleaner = RedisStoragePlugin(url, key_prefix=prefix)
        await cleaner.wipe()
        await cleaner.close()
        await opened.close_all()


@pytest.fixture(scope="module")
def pg_table() -> Iterator[str]:
    """A table name unique to this module (and this xdist worker), dropped at the end."""
    url = postgres_url()
    name = f"istos_kv_test_{uuid.uuid4().hex[:12]}"
    yield name
    # A module-scoped fixture outlives the per-test event loops, so it brings its own.
    asyncio.run(drop_postgres_table(url, name))


@pytest.mark.postgres
class TestPostgresContract(StorageContract):
    @pytest.fixture
    async def make_storage(self, pg_table: str) -> AsyncIterator[MakeStorage]:
        url = postgres_url()
        opened = _Opened()
        first = await opened.add(SQLAlchemyStoragePlugin(url, table=pg_table))
        await first.wipe()  # type: ignore[attr-defined]
        yield lambda: opened.add(SQLAlchemyStoragePlugin(url, table=pg_table))
        cleaner = SQLAlchemyStoragePlugin(url, table=pg_table)
        await cleaner.wipe()
        await cleaner.close()
        await opened.close_all()


@pytest.mark.fast
class TestSQLiteFileContract(StorageContract):
    @pytest.fixture
    async def make_storage(self, tmp_path: Path) -> AsyncIterator[MakeStorage]:
        url = f"sqlite+aiosqlite:///{tmp_path / 'istos.db'}"
        opened = _Opened()
        yield lambda: opened.add(SQLAlchemyStoragePlugin(url))
        await opened.close_all()


@pytest.mark.fast
class TestSQLiteMemoryContract(StorageContract):
    @pytest.fixture
    async def make_storage(self) -> AsyncIterator[MakeStorage]:
        opened = _Opened()
        yield lambda: opened.add(SQLAlchemyStoragePlugin("sqlite+aiosqlite:///:memory:"))
        await opened.close_all()


# -- flags and configuration ------------------------------------------------------------------


def test_flags() -> None:
    assert RedisStoragePlugin().durable and RedisStoragePlugin().shared
    pg = SQLAlchemyStoragePlugin("postgresql+asyncpg://postgres@127.0.0.1:5432/test")
    assert pg.durable and pg.shared
    lite = SQLAlchemyStoragePlugin("sqlite+aiosqlite:///some/file.db")
    assert lite.durable and lite.shared
    for url in ("sqlite+aiosqlite:///:memory:", "sqlite+aiosqlite://"):
        mem = SQLAlchemyStoragePlugin(url)
        assert not mem.durable and not mem.shared, url


def test_unsupported_dialect_is_config_error() -> None:
    with pytest.raises(ConfigError, match="postgresql and sqlite"):
        SQLAlchemyStoragePlugin("mysql+aiomysql://root@127.0.0.1/test")
    with pytest.raises(ConfigError):
        SQLAlchemyStoragePlugin("not a url")


def test_missing_redis_package_is_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes the import raise ImportError, as if not installed.
    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(ConfigError, match=r"pip install istos-nb\[redis\]"):
        RedisStoragePlugin()


def test_missing_sqlalchemy_package_is_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sqlalchemy", None)
    with pytest.raises(ConfigError, match=r"pip install istos-nb\[sqlalchemy\]"):
        SQLAlchemyStoragePlugin("sqlite+aiosqlite:///:memory:")


def test_importing_adapters_does_not_import_drivers() -> None:
    code = (
        "import sys, istos, istos.storage.redis, istos.storage.sqlalchemy\n"
        "bad = [m for m in ('redis', 'sqlalchemy', 'asyncpg', 'aiosqlite') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


# -- service detection ------------------------------------------------------------------------


@pytest.mark.parametrize("finder", [redis_url, postgres_url])
def test_missing_service_skips_locally_and_fails_in_ci(
    monkeypatch: pytest.MonkeyPatch, finder: object
) -> None:
    import services

    monkeypatch.setattr(services, "reachable", lambda *a, **k: False)
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="start it with"):
        finder()  # type: ignore[operator]
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="required in CI"):
        finder()  # type: ignore[operator]


# -- outages ----------------------------------------------------------------------------------


async def _expect_unavailable(storage: Storage, *must_mention: str) -> StorageUnavailable:
    start = time.monotonic()
    with pytest.raises(StorageUnavailable) as info:
        await storage.put("jobs:q", "k", b"v")
    assert time.monotonic() - start < OUTAGE_BOUND_S
    message = str(info.value)
    for text in must_mention:
        assert text in message
    assert "s3cret" not in message
    return info.value


async def test_redis_closed_port_is_unavailable() -> None:
    storage = RedisStoragePlugin("redis://:s3cret@127.0.0.1:1/0", connect_timeout_s=1.0)
    try:
        await _expect_unavailable(storage, "127.0.0.1:1", "put")
        with pytest.raises(StorageUnavailable, match="open"):
            await storage.open()
    finally:
        await storage.close()


async def test_postgres_closed_port_is_unavailable() -> None:
    url = "postgresql+asyncpg://postgres:s3cret@127.0.0.1:1/test"
    storage = SQLAlchemyStoragePlugin(url, op_timeout_s=2.0)
    try:
        await _expect_unavailable(storage, "127.0.0.1:1", "put")
        with pytest.raises(StorageUnavailable, match="get"):
            await storage.get("jobs:q", "k")
    finally:
        await storage.close()


async def test_sqlite_unopenable_file_is_unavailable(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'no-such-dir' / 'x.db'}"
    storage = SQLAlchemyStoragePlugin(url, op_timeout_s=2.0)
    try:
        await _expect_unavailable(storage, "x.db", "put")
    finally:
        await storage.close()
        # aiosqlite's thread for the connection that failed to open reports its stop to this
        # loop a moment later; let it finish while the loop is open (pytest closes it next).
        for thread in threading.enumerate():
            if "_connection_worker_thread" in thread.name:
                await asyncio.to_thread(thread.join, 5.0)


class _Blackhole:
    """A port that accepts TCP connections (via the kernel backlog) and never answers."""

    def __enter__(self) -> int:
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        return int(self._sock.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        self._sock.close()


async def test_redis_silent_server_times_out() -> None:
    with _Blackhole() as port:
        storage = RedisStoragePlugin(
            f"redis://127.0.0.1:{port}/0", connect_timeout_s=0.5, op_timeout_s=0.5
        )
        try:
            await _expect_unavailable(storage, f"127.0.0.1:{port}", "put")
        finally:
            await storage.close()


async def test_redis_call_deadline_holds_in_a_task_and_outside_any() -> None:
    """The whole-call deadline (beyond the socket timeouts) ends a call that never completes
    with StorageUnavailable, from a Task (asyncio.timeout) and from a request's eager first
    step that runs outside any Task before Python 3.12 (wait_for)."""
    from istos.transport.zenoh import _start_eagerly

    storage = RedisStoragePlugin(redis_url(), connect_timeout_s=0.05, op_timeout_s=0.05)
    storage._deadline_s = 0.2  # (the cap itself; the socket timeouts play no part below)
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def hangs(_client: object) -> None:
        await asyncio.shield(never)

    async def in_a_task() -> str:
        assert asyncio.current_task() is not None
        try:
            await storage._call("apply", hangs)
        except StorageUnavailable as exc:
            return str(exc)
        return "returned"

    seen: list[str] = []

    async def eager() -> None:
        try:
            await storage._call("apply", hangs)
        except StorageUnavailable as exc:
            seen.append(str(exc))

    try:
        assert "during apply" in await asyncio.wait_for(in_a_task(), 10)
        loop = asyncio.get_running_loop()
        started: asyncio.Future[asyncio.Task[None] | None] = loop.create_future()
        # As the Zenoh transport serves a request: from a loop callback, outside any Task.
        loop.call_soon(lambda: started.set_result(_start_eagerly(loop, eager())))
        task = await started
        assert task is not None
        await asyncio.wait_for(task, 10)
        assert len(seen) == 1 and "during apply" in seen[0]
    finally:
        never.cancel()
        await storage.close()


async def test_postgres_silent_server_times_out() -> None:
    with _Blackhole() as port:
        url = f"postgresql+asyncpg://postgres:s3cret@127.0.0.1:{port}/test"
        storage = SQLAlchemyStoragePlugin(url, op_timeout_s=1.0)
        try:
            await _expect_unavailable(storage, f"127.0.0.1:{port}", "put")
        finally:
            await storage.close()


async def _start_redis(binary: str, port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        + ["--daemonize", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 5.0
    while not reachable("127.0.0.1", port, timeout_s=0.2):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait(5)
            pytest.fail(f"throwaway redis-server did not start on port {port}")
        await asyncio.sleep(0.05)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()  # SIGKILL: a crash, not a graceful shutdown
    proc.wait(5)


@pytest.mark.redis
async def test_redis_recovers_after_server_restart() -> None:
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("redis-server binary is required in CI")
        pytest.skip("redis-server binary not on PATH")
    port = free_port()
    proc = await _start_redis(binary, port)
    storage = RedisStoragePlugin(
        f"redis://127.0.0.1:{port}/0", key_prefix="recovery", connect_timeout_s=1.0
    )
    try:
        await storage.open()
        await storage.put("jobs:q", "k", b"before")
        # Run the Lua script once so the client caches its SHA; the restarted server will not
        # know it, which the client must survive.
        assert await storage.put_if_absent("ledger", "a", b"1", now=1.0)

        _stop(proc)
        await _expect_unavailable(storage, f"127.0.0.1:{port}", "put")
        with pytest.raises(StorageUnavailable, match="put_if_absent"):
            await storage.put_if_absent("ledger", "b", b"2", now=1.0)

        proc = await _start_redis(binary, port)
        # No persistence: the data is gone, but the very next call must work.
        await storage.put("jobs:q", "k", b"after")
        assert await storage.get("jobs:q", "k") == b"after"
        assert await storage.put_if_absent("ledger", "a", b"3", now=1.0) is True
        assert await storage.put_if_absent("ledger", "a", b"4", now=1.0) is False
    finally:
        await storage.close()
        _stop(proc)


@pytest.mark.postgres
async def test_postgres_concurrent_first_use_creates_table_once(pg_table: str) -> None:
    # Several replicas starting at once all try to create the table; none may fail for it.
    url = postgres_url()
    table = f"{pg_table}_race"
    instances = [SQLAlchemyStoragePlugin(url, table=table) for _ in range(6)]
    try:
        await asyncio.wait_for(
            asyncio.gather(*(s.put("ns", f"k{i}", b"v") for i, s in enumerate(instances))), 20
        )
        assert len(await instances[0].scan("ns")) == len(instances)
    finally:
        for storage in instances:
            await storage.close()
        await drop_postgres_table(url, table)


async def test_sqlite_concurrent_first_use_creates_table_once(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'race.db'}"
    instances = [SQLAlchemyStoragePlugin(url) for _ in range(6)]
    try:
        await asyncio.wait_for(
            asyncio.gather(*(s.put("ns", f"k{i}", b"v") for i, s in enumerate(instances))), 20
        )
        assert len(await instances[0].scan("ns")) == len(instances)
    finally:
        for storage in instances:
            await storage.close()
