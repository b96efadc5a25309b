"""A cancel always ends what it cancels: ``app.stop()`` of an HA queue on Redis returns.

On Python 3.11, ``asyncio.wait_for`` swallows a cancel of its Task that arrives in the same loop
iteration as its inner awaitable ends; redis-py waits for every command it sends that way, so
an HA election cancelled by ``stop`` while a renewal was in flight could keep running, and
``stop`` waited for it forever. The storage adapters re-raise such a cancel
(``istos/cancel_guard.py``). Here on a private redis-server and a SQLite file:

- a storage call cancelled at each loop iteration of its life either ended before the cancel
  or raises CancelledError (walking the cancel across the iterations finds the window: no
  timing involved);
- two apps leading and following an HA queue stop, each within a bound, when the stop comes
  while the leader's renewal is in flight.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from services import free_port, start_throwaway_redis
from zenoh_util import wait_until

from istos import Istos, RedisStoragePlugin, SQLAlchemyStoragePlugin
from istos.transport.local import LocalMesh

pytestmark = [
    pytest.mark.redis,  # a private redis-server (the binary), not the shared one
    pytest.mark.skipif(sys.version_info < (3, 11),
                       reason="Task.cancelling() and asyncio.timeout are 3.11+"),
]

STEPS = 30  # loop iterations a storage call is cancelled at (one call takes a few)
STOP_BOUND_S = 30.0  # a bound on each stop, not a sync: a stop that hangs never returns


@pytest.fixture
def redis_port() -> Iterator[int]:
    port = free_port()
    proc: subprocess.Popen[bytes] = start_throwaway_redis(port)
    try:
        yield port
    finally:
        proc.kill()
        proc.wait(5)


async def cancelled_at_every_step(storage: Any) -> list[int]:
    """Cancel a ``get`` after 0, 1, ... STEPS loop iterations; the steps at which the cancel
    was requested (``cancel()`` True) and the call still returned (a swallowed cancel)."""
    swallowed = []
    for steps in range(STEPS):
        call = asyncio.ensure_future(storage.get("ns", "k"))
        for _ in range(steps):
            await asyncio.sleep(0)  # one loop iteration: where the cancel lands, not a wait
        if not call.cancel():
            continue  # it ended first: nothing to cancel
        try:
            await call
        except asyncio.CancelledError:
            continue
        swallowed.append(steps)
    return swallowed


async def test_a_cancelled_redis_call_raises_at_every_step(redis_port: int) -> None:
    storage = RedisStoragePlugin(f"redis://127.0.0.1:{redis_port}/0", key_prefix="c")
    await storage.open()
    try:
        await storage.put("ns", "k", b"v")
        assert await cancelled_at_every_step(storage) == []
        assert await storage.get("ns", "k") == b"v"  # the client is still usable
    finally:
        await storage.close()


async def test_a_cancelled_sql_call_raises_at_every_step(tmp_path: Path) -> None:
    storage = SQLAlchemyStoragePlugin(f"sqlite+aiosqlite:///{tmp_path / 'kv.db'}")
    await storage.open()
    try:
        await storage.put("ns", "k", b"v")
        assert await cancelled_at_every_step(storage) == []
        assert await storage.get("ns", "k") == b"v"
    finally:
        await storage.close()


class SeenRenewals(RedisStoragePlugin):
    """A node's store that says when a leader renewal starts (the stop is sent then)."""

    def __init__(self, url: str) -> None:
        super().__init__(url, key_prefix="s")
        self.renewing = asyncio.Event()

    async def renew_leader(self, name: str, holder: str, epoch: int, *, now: float,
                           ttl_s: float) -> bool:
        self.renewing.set()
        return await super().renew_leader(name, holder, epoch, now=now, ttl_s=ttl_s)


@pytest.mark.slow
async def test_ha_apps_on_redis_stop_while_a_renewal_is_in_flight(redis_port: int) -> None:
    url = f"redis://127.0.0.1:{redis_port}/0"
    for steps in range(STEPS // 2):  # each round: a fresh pair, stopped at a fresh renewal
        # ... that many loop iterations after it started (the stop's own awaits before it
        # cancels the election add their iterations: the rounds walk the cancel across the
        # renewal's Redis call)
        mesh = LocalMesh()
        apps = []
        for name in ("a", "b"):
            app = Istos(storage=SeenRenewals(url), transport=mesh.transport(name),
                        node_id=name, shutdown_grace_s=0.0)
            app.queue("q", ha=True, ha_lease_s=0.5)

            @app.worker("q")
            async def handle(job: Any) -> Any:
                return job

            apps.append(app)
        leader: Istos | None = None
        for app in apps:
            await app.start()
        try:
            await wait_until(lambda apps=apps: any(a.is_active_owner("q") for a in apps), 30,
                             "a leader")
            leader = next(a for a in apps if a.is_active_owner("q"))
            store = leader.node.storage
            assert isinstance(store, SeenRenewals)
            store.renewing.clear()
            # Bounded without wait_for's extra Task, which would wake this test iterations
            # after the renewal started, past the window the rounds walk.
            async with asyncio.timeout(STOP_BOUND_S):
                await store.renewing.wait()
            for _ in range(steps):
                await asyncio.sleep(0)  # one loop iteration: where the stop lands, not a wait
        finally:
            # The leader first, while its renewal is in flight; a stop that swallowed its
            # election's cancel would never return.
            for app in sorted(apps, key=lambda a: a is not leader):
                await asyncio.wait_for(app.stop(), STOP_BOUND_S)
