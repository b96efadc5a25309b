"""The write path's rule for reads and for an owner's other records, on a private redis-server
the test freezes (SIGSTOP), thaws or kills (nothing here touches the shared Redis on 6379).

- A read answers only with what storage holds (the read fence,
  ``owner/persistence/write_path.py``): a read racing a write that is slow waits for it and
  then reports the new state; a read racing a write that fails reports the stored state,
  never the rolled-back one.
- A read waits for a write no longer than the storage's own request timeout: a write the
  frozen store never answers makes the read answer StorageUnavailable, not hang.
- Every other record an owner stores (chord reservations, chord barriers) goes through the
  write path with an HA leader's fence: a deposed leader's write is refused and it stops.

Order is made by events and state, not sleeps: the store is frozen before the write is sent,
and the test waits (bounded) until the write is in flight and the read waits on the fence.
"""

from __future__ import annotations

import asyncio
import secrets
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgpack
import pytest
from services import free_port, start_throwaway_redis
from zenoh_util import wait_until

from istos import (
    Istos,
    IstosError,
    MemoryStorage,
    RedisStoragePlugin,
    SQLAlchemyStoragePlugin,
    StorageUnavailable,
)
from istos.core import workflow_meta as wf
from istos.errors import InvalidJob
from istos.owner.extension import Hooks
from istos.owner.persistence.write_path import WritePath
from istos.storage.base import UNSTATED_REQUEST_TIMEOUT_S, request_timeout_s
from istos.transport.local import LocalMesh

pytestmark = pytest.mark.redis  # a private redis-server (the binary), not the shared one


class FrozenStore:
    """A private redis-server (no persistence) that the test can freeze, thaw and kill."""

    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] = start_throwaway_redis(self.port)

    def plugin(self, *, op_timeout_s: float = 30.0) -> RedisStoragePlugin:
        # A long op timeout: a frozen store makes a write slow, not failed, until killed.
        return RedisStoragePlugin(f"redis://127.0.0.1:{self.port}/0", key_prefix="t",
                                  connect_timeout_s=0.3, op_timeout_s=op_timeout_s)

    def freeze(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # (a stopped process dies of SIGKILL too)
            self.proc.wait(5)


@pytest.fixture
def store() -> Iterator[FrozenStore]:
    server = FrozenStore()
    try:
        yield server
    finally:
        server.thaw()
        server.kill()


@pytest.fixture
async def app(store: FrozenStore) -> AsyncIterator[Istos]:
    node = Istos(storage=store.plugin(), transport=LocalMesh().transport("owner"),
                 shutdown_grace_s=0.0, request_timeout_s=30.0)
    node.queue("q", lease_s=60, max_attempts=3, keep_results=True)
    async with node.serving():
        yield node


async def leased_job(app: Istos) -> tuple[str, str]:
    jid = await app.enqueue("q", {"n": 1})
    reply = await app.client("q").call("claim", workers=["w#0"], node="w")
    (job,) = reply["jobs"]
    return jid, job["token"]


async def ack_in_flight(app: Istos, jid: str, token: str) -> asyncio.Task[dict[str, Any]]:
    """Send an ack to the frozen store's owner; return once its write is in flight (memory
    says done, storage does not yet)."""
    writes: WritePath = app.owners["q"].writes
    before = writes.applied_seq
    ack = asyncio.create_task(app.client("q").call("ack", job_id=jid, token=token,
                                                    result=b"r"))
    await wait_until(lambda: writes.applied_seq > before, 10, "the ack's write in flight")
    assert writes.durable_seq < writes.applied_seq
    assert app.owners["q"].state.jobs[jid].state == "done"  # memory is ahead of storage
    return ack


async def reads_waiting(app: Istos, jid: str) -> list[asyncio.Task[dict[str, Any]]]:
    """``result`` and ``stats`` sent now; return once both wait on the read fence."""
    writes: WritePath = app.owners["q"].writes
    client = app.client("q")
    reads = [asyncio.create_task(client.call("result", job_id=jid)),
             asyncio.create_task(client.call("stats"))]
    await wait_until(lambda: writes.waiting_reads + sum(r.done() for r in reads) == 2, 10,
                     "both reads answered or held on the fence")
    assert not any(r.done() for r in reads), "a read answered before the write was stored"
    return reads


async def stored_state(store: FrozenStore, jid: str) -> str:
    probe = store.plugin()
    try:
        raw = await probe.get("jobs:q", jid)
    finally:
        await probe.close()
    assert raw is not None
    return str(msgpack.unpackb(raw, raw=False)["state"])


async def test_a_read_racing_a_slow_write_answers_once_it_is_stored(app: Istos,
                                                                    store: FrozenStore) -> None:
    jid, token = await leased_job(app)
    store.freeze()
    try:
        ack = await ack_in_flight(app, jid, token)
        reads = await reads_waiting(app, jid)
    finally:
        store.thaw()
    assert (await ack)["status"] == "ok"
    result, stats = await asyncio.gather(*reads)
    assert result["state"] == "done" and result["result"] == b"r"
    assert stats["stats"]["counts"]["done"] == 1 and stats["stats"]["counts"]["leased"] == 0
    assert await stored_state(store, jid) == "done"


async def test_a_read_racing_a_failed_write_never_reports_the_rolled_back_state(
        app: Istos, store: FrozenStore) -> None:
    jid, token = await leased_job(app)
    store.freeze()
    ack = await ack_in_flight(app, jid, token)
    reads = await reads_waiting(app, jid)
    store.kill()  # the ack's write fails: memory goes back to what storage holds (leased)
    with pytest.raises(StorageUnavailable):
        await ack
    outcomes = await asyncio.gather(*reads, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):  # the one other answer the rule allows
            assert isinstance(outcome, StorageUnavailable), outcome
    result, stats = outcomes
    if not isinstance(result, BaseException):
        assert result["state"] == "leased" and result["result"] is None
    if not isinstance(stats, BaseException):
        assert stats["stats"]["counts"]["done"] == 0 and stats["stats"]["counts"]["leased"] == 1
    assert app.owners["q"].state.jobs[jid].state == "leased"


async def test_a_read_of_an_idle_queue_waits_for_nothing(app: Istos, store: FrozenStore) -> None:
    """Reads touch no storage, and with no write in flight the fence lets them through: a
    frozen store does not hold them."""
    jid, _ = await leased_job(app)
    store.freeze()
    try:
        result = await app.client("q").call("result", job_id=jid)
        stats = await app.client("q").call("stats")
    finally:
        store.thaw()
    assert result["state"] == "leased" and stats["stats"]["counts"]["leased"] == 1


async def test_a_change_a_failed_request_left_is_written_and_holds_no_read(
        app: Istos, store: FrozenStore) -> None:
    """A handler that changed memory and then raised, without a commit (a bug: none does),
    leaves no read waiting on a write nobody makes: once no request is in flight, its change
    is written in the background, and the read then reports it."""
    owner = app.owners["q"]
    jid = await app.enqueue("q", {"n": 1}, delay_s=3600.0)

    async def promote_then_fail(msg: dict[str, Any]) -> dict[str, Any]:
        assert owner.state.promote(jid, owner.node.clock.now())
        raise InvalidJob("refused after a change, without a commit")

    owner.extend(Hooks(name="buggy", ops={"buggy": promote_then_fail}))
    reply = await owner.dispatch({"op": "buggy"}, trusted=True)
    assert reply["ok"] is False
    # Handed to the persister as the request ended (no await since: the sweeper, which also
    # writes what it finds, did not run in between).
    assert not owner.state.dirty
    stats = await asyncio.wait_for(app.client("q").call("stats"), 10)  # a bound, not a sync
    assert stats["stats"]["counts"]["ready"] == 1
    assert await stored_state(store, jid) == "ready"


# -- a deposed HA leader's other records ------------------------------------------------------

class HeldRenewals(RedisStoragePlugin):
    """The leader's store, whose lease renewals the test can hold back (a renewal every
    0.25 s would find the new epoch too, and stop the leader before its fenced write does)."""

    def __init__(self, url: str) -> None:
        super().__init__(url, key_prefix="t", connect_timeout_s=0.3, op_timeout_s=30.0)
        self.renewals = asyncio.Event()
        self.renewals.set()
        self.renewing = 0  # renewals past the gate, not yet answered

    async def renew_leader(self, name: str, holder: str, epoch: int, *, now: float,
                           ttl_s: float) -> bool:
        await self.renewals.wait()
        self.renewing += 1
        try:
            return await super().renew_leader(name, holder, epoch, now=now, ttl_s=ttl_s)
        finally:
            self.renewing -= 1


async def deposed(app: Istos, store: FrozenStore, queue: str) -> None:
    """Another epoch of ``queue`` begins in the store behind the leader's back (an intruder
    holding it long past the test): with its renewals held, the leader does not know until
    its next fenced write."""
    held = app.node.storage
    assert isinstance(held, HeldRenewals)
    held.renewals.clear()
    await wait_until(lambda: held.renewing == 0, 10, "no renewal in flight")
    probe = store.plugin()
    try:
        lease = await probe.read_leader(f"ha:{queue}")
        assert lease is not None
        assert await probe.acquire_leader(f"ha:{queue}", "intruder", now=app.node.clock.now(),
                                          ttl_s=3600.0, steal_from=lease.holder)
    finally:
        await probe.close()
    assert app.is_active_owner(queue)  # still serving: nothing told it


async def keys_in(store: FrozenStore, ns: str) -> list[str]:
    probe = store.plugin()
    try:
        return [key for key, _ in await probe.scan(ns)]
    finally:
        await probe.close()


async def test_a_deposed_leaders_chord_reservation_and_barrier_are_refused(
        store: FrozenStore) -> None:
    held = HeldRenewals(f"redis://127.0.0.1:{store.port}/0")
    app = Istos(storage=held, transport=LocalMesh().transport("a"), node_id="a",
                shutdown_grace_s=0.0, request_timeout_s=5.0)
    for queue in ("m", "cb"):  # members on m, the callback on cb; long leases: no renewal
        app.queue(queue, ha=True, ha_lease_s=600.0)
    async with app.serving():
        await wait_until(lambda: app.is_active_owner("m") and app.is_active_owner("cb"), 30,
                         "both queues led")
        key = secrets.token_hex(16)
        opened = wf.chord_id(key, "m", 1, "cb")
        # While cb leads, its reservation for chord `opened` is stored.
        reply = await app.client("cb").call("chord_reserve", chord_id=opened,
                                            member_queue="m", size=1, key=key)
        assert reply["reserved"] is True

        # m is deposed: its barrier write for `opened` is refused, and m stops serving.
        await deposed(app, store, "m")
        leader = app.owners["m"]  # (the election may start another once it finds it stopped)
        with pytest.raises(IstosError):
            await app.client("m").call("chord_open", chord_id=opened, size=1, callback="cb",
                                       key=key)
        assert not leader.running
        assert opened not in await keys_in(store, "wf:m")

        # cb is deposed: its next reservation is refused, and cb stops serving.
        await deposed(app, store, "cb")
        leader = app.owners["cb"]
        other = secrets.token_hex(16)
        refused = wf.chord_id(other, "m", 1, "cb")
        with pytest.raises(IstosError):
            await app.client("cb").call("chord_reserve", chord_id=refused,
                                        member_queue="m", size=1, key=other)
        assert not leader.running
        assert await keys_in(store, "wf:cb") == [f"cb:{opened}"]
        # Renewals stay held through the stop: the elections' tasks are cancelled waiting.


async def test_a_read_waits_for_a_write_no_longer_than_the_storage_request_timeout(
        store: FrozenStore) -> None:
    """A write the frozen store never answers holds a read only for the storage's own request
    timeout (Redis: ``op_timeout_s``): the read then answers StorageUnavailable naming the
    queue while the write still hangs, and once the store is back a read answers as storage
    holds the job."""
    bound = 1.0
    app = Istos(storage=store.plugin(op_timeout_s=bound), transport=LocalMesh().transport("o"),
                shutdown_grace_s=0.0, request_timeout_s=30.0)
    app.queue("q", lease_s=60, max_attempts=3, keep_results=True)
    async with app.serving():
        writes: WritePath = app.owners["q"].writes
        assert writes.read_wait_s == bound
        jid, token = await leased_job(app)
        store.freeze()
        try:
            ack = await ack_in_flight(app, jid, token)
            with pytest.raises(StorageUnavailable, match=r"queue 'q'.*within 1 s"):
                # (a bound on the test, not a sync: the read's own bound answers first)
                await asyncio.wait_for(app.client("q").call("result", job_id=jid), 20 * bound)
            assert writes.durable_seq < writes.applied_seq  # answered while the write hangs
        finally:
            store.thaw()
        acked = (await asyncio.gather(ack, return_exceptions=True))[0]
        if isinstance(acked, BaseException):  # the write timed out: rolled back to leased
            assert isinstance(acked, StorageUnavailable), acked
        result = await app.client("q").call("result", job_id=jid)
        assert result["state"] == await stored_state(store, jid)
        assert result["state"] == ("leased" if isinstance(acked, BaseException) else "done")


def test_each_storage_states_how_long_a_read_waits_for_its_writes(store: FrozenStore) -> None:
    assert request_timeout_s(store.plugin(op_timeout_s=7.0)) == 7.0
    assert request_timeout_s(SQLAlchemyStoragePlugin("sqlite+aiosqlite:///:memory:",
                                                     op_timeout_s=3.0)) == 3.0
    assert request_timeout_s(MemoryStorage()) == UNSTATED_REQUEST_TIMEOUT_S  # none stated
