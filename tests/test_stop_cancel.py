"""A cancel always ends what it cancels: a stop that cancels a task and awaits it returns.

On Python 3.11, ``asyncio.wait_for`` swallows a cancel of its Task that arrives in the same loop
iteration as its inner awaitable ends: the task goes on, and a stop that awaits it waits
forever. The engine awaits every deadline through ``istos.cancel_guard.within``, which does not
swallow one (``asyncio.timeout``) and raises again a cancel swallowed inside what it awaits
(redis-py waits for every command with ``wait_for``). Walking the cancel across the loop
iterations of the window finds it, with no timing involved:

- a storage call (a private redis-server, a SQLite file) cancelled at each loop iteration of its
  life either ended before the cancel or raises CancelledError;
- two apps leading and following an HA queue on Redis stop, each within a bound, when the stop
  comes while the leader's renewal is in flight;
- a worker's prefetched job waiting for an execution slot, cancelled as the slot frees, raises
  CancelledError and takes no slot (else it would run its job after the stop, which waits for
  it);
- an outbox relay stopped as a commit's notification ends its idle wait stops, within a bound;
  a cancel of that stop itself reaches its caller.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from services import free_port, start_throwaway_redis
from zenoh_util import wait_until

from istos import Istos, RedisStoragePlugin, SQLAlchemyStoragePlugin
from istos.clock import SystemClock
from istos.outbox.relay import OutboxRelay
from istos.outbox.sql import SQLOutboxStore
from istos.outbox.store import OutboxRow
from istos.transport.local import LocalMesh
from istos.worker.waiting import WaitingJobs

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11),
                                reason="Task.cancelling() and asyncio.timeout are 3.11+")

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


@pytest.mark.redis  # a private redis-server (the binary), not the shared one
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


@pytest.mark.redis
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


class HeldFor:
    """A prefetched job's lease end, as :class:`~istos.worker.waiting.WaitingJobs` reads it."""

    def __init__(self, expires: float) -> None:
        self.expires = expires


async def test_a_job_waiting_for_a_slot_cancelled_as_the_slot_frees_takes_none() -> None:
    # The worker's stop (and kill) cancel a job waiting here; one whose cancel was swallowed as
    # the slot it waits for freed would hold the slot and run its job, and the stop waits for
    # that run. Each round: a running job holds the one slot, the waiting job is cancelled in
    # the loop iteration in which the running one gives the slot back, that many iterations
    # after the wait began.
    clock = SystemClock()

    async def never_sent(items: list[dict[str, Any]]) -> None:
        raise AssertionError("nothing is handed back here")

    kept_running = []
    for steps in range(STEPS):
        slots = asyncio.Semaphore(1)
        await slots.acquire()  # the running job's
        waiting = WaitingJobs(slots, clock, lease_s=lambda: None, claim_rtt=lambda: None,
                              send_release=never_sent, tasks=set())
        call = asyncio.ensure_future(waiting.take_slot(HeldFor(clock.monotonic() + 3600)))
        for _ in range(steps):
            await asyncio.sleep(0)  # one loop iteration: where the cancel lands, not a wait
        slots.release()  # the running job ended ...
        assert call.cancel()  # ... as the stop cancels the waiting one
        try:
            await call
        except asyncio.CancelledError:
            assert not slots.locked(), f"step {steps}: the cancelled wait kept the slot"
            continue
        kept_running.append(steps)
    assert kept_running == []


class AnnouncedCommits(SQLOutboxStore):
    """An outbox in a SQLite file whose commits the test announces, as PostgreSQL's LISTEN
    does (``wake``), and which says when a claim found nothing (the relay goes idle then)."""

    def __init__(self, url: str, table: str) -> None:
        super().__init__(url, table)
        self.wake: Callable[[], None] | None = None
        self.idle = asyncio.Event()

    async def listen(self, wake: Callable[[], None]) -> None:
        self.wake = wake
        await asyncio.Event().wait()  # until cancelled, as a LISTEN connection

    async def claim(self, token: str, now: float, claim_s: float, limit: int,
                    queues: list[str] | None) -> list[OutboxRow]:
        rows = await super().claim(token, now, claim_s, limit, queues)
        if not rows:
            self.idle.set()  # the relay's next await is its idle wait, in this same step
        return rows


async def idle_relay(app: Istos, url: str) -> tuple[OutboxRelay, AnnouncedCommits]:
    """A fresh relay on ``url``, started and waiting idle (its poll far beyond the bound, so
    only a wake ends that wait)."""
    store = AnnouncedCommits(url, "outbox")
    relay = OutboxRelay(app, store, poll_s=STOP_BOUND_S * 100)
    await relay.start()
    async with asyncio.timeout(STOP_BOUND_S):
        await store.idle.wait()
    return relay, store


async def test_an_outbox_relay_stopped_as_a_commit_wakes_it_stops(tmp_path: Path) -> None:
    # poll_s is far beyond the bound: only a wake ends the idle wait, so a relay whose stop's
    # cancel was swallowed as the wake ended that wait goes idle again and its stop never
    # returns. Each round: a fresh relay, woken in its idle wait, stopped that many loop
    # iterations later.
    url = f"sqlite+aiosqlite:///{tmp_path / 'outbox.db'}"
    app = Istos(transport=LocalMesh().transport("relay"))
    async with app.serving():
        for steps in range(STEPS):
            relay, store = await idle_relay(app, url)
            assert store.wake is not None
            store.wake()  # a commit's notification
            for _ in range(steps):
                await asyncio.sleep(0)  # one loop iteration: where the stop lands, not a wait
            async with asyncio.timeout(STOP_BOUND_S):
                await relay.stop()


async def test_a_cancel_of_an_outbox_relays_stop_propagates(tmp_path: Path) -> None:
    # The caller of a stop may itself be cancelled (a stop under a deadline): that cancel must
    # reach it, not be taken for the relay task's own end. Each round: a fresh relay whose
    # stop is cancelled that many loop iterations after it began.
    url = f"sqlite+aiosqlite:///{tmp_path / 'outbox.db'}"
    app = Istos(transport=LocalMesh().transport("relay"))
    swallowed = []
    async with app.serving():
        for steps in range(STEPS):
            relay, store = await idle_relay(app, url)
            stopping = asyncio.ensure_future(relay.stop())
            for _ in range(steps):
                await asyncio.sleep(0)  # one loop iteration: where the cancel lands, not a wait
            cancelled = stopping.cancel()
            try:
                async with asyncio.timeout(STOP_BOUND_S):
                    await stopping
            except asyncio.CancelledError:
                continue
            finally:
                await store.close()  # a cancelled stop may not have come to it
            if cancelled:
                swallowed.append(steps)
    assert swallowed == []
