"""Fenced HA leadership on the in-process mesh with shared durable storage.

A leader whose epoch another replica took stops at once and reloads before serving again; a
leader that cannot renew steps down; a partitioned leader that still renews keeps its lease; a
stand-in's refusal never hides the leader's answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from istos import Istos, IstosError, MemoryStorage
from istos.core.records import encode_record
from istos.core.state import JobRecord
from istos.storage.base import Fence
from istos.transport.local import LocalMesh

pytestmark = pytest.mark.fast  # `make check`: no process, server or session

LEASE = "ha:q"


class Cut:
    """A network model with a switchable partition between two node ids."""

    def __init__(self) -> None:
        self.cut: set[frozenset[str]] = set()

    def delay(self, src: str, dst: str) -> float | None:
        return None if frozenset((src, dst)) in self.cut else 0.0

    def reachable(self, src: str, dst: str) -> bool:
        return frozenset((src, dst)) not in self.cut


async def until(pred: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async def loop() -> None:
        while not pred():
            await asyncio.sleep(0.01)  # leadership is a side effect of the election's task
    await asyncio.wait_for(loop(), timeout_s)


def replica(mesh: LocalMesh, name: str, storage: MemoryStorage, ha_lease_s: float = 0.6
            ) -> Istos:
    app = Istos(storage=storage, transport=mesh.transport(name), node_id=name,
                request_timeout_s=1.0)
    app.queue("q", ha=True, ha_lease_s=ha_lease_s, lease_s=30, sweep_interval_s=0.05)
    return app


async def two_replicas(mesh: LocalMesh, storage: MemoryStorage, ha_lease_s: float = 1.5
                       ) -> tuple[Istos, Istos]:
    a = replica(mesh, "a", storage, ha_lease_s)
    b = replica(mesh, "b", storage, ha_lease_s)
    await a.start()
    await until(lambda: a.is_active_owner("q"))
    await b.start()
    return a, b


async def test_leader_whose_epoch_was_taken_stops_and_reloads():
    mesh, storage = LocalMesh(), MemoryStorage(durable=True, shared=True)
    a, b = await two_replicas(mesh, storage)
    producer = Istos(transport=mesh.transport("p"), request_timeout_s=1.0)
    try:
        async with producer.serving():
            for i in range(3):
                await producer.enqueue("q", {"i": i}, job_id=f"j{i}")
            old = a.owners["q"]
            first_epoch = a.elections["q"].epoch
            # Another leader (think: a's process was frozen past its lease) takes the epoch
            # and accepts a job that a's memory has never seen.
            lease = await storage.read_leader(LEASE)
            assert lease is not None and lease.epoch == first_epoch
            now = a.node.clock.now()
            intruder = await storage.acquire_leader(LEASE, "intruder", now=now + 2.0, ttl_s=0.3)
            assert intruder == first_epoch + 1
            rec = JobRecord("j-new", "q", b"\xa1x", 0, now)
            await storage.put("jobs:q", "j-new", encode_record(rec))
            # a's next write is refused by the fence: the claim leases nothing, a stops at once.
            with pytest.raises(IstosError):
                await producer.client("q").call("claim", workers=["w#0"], node="w")
            assert not old.running and old.state.counts["leased"] == 0
            assert all(r.attempts == 0 for r in old.state.jobs.values())
            # The intruder never renews; a (first in line) takes a new epoch with a fresh owner
            # that reloaded from storage, so the job it had never seen is there.
            await until(lambda: a.is_active_owner("q") or b.is_active_owner("q"))
            leader = a if a.is_active_owner("q") else b
            assert leader.elections["q"].epoch == first_epoch + 2
            assert leader.owners["q"] is not old
            assert set(leader.owners["q"].state.jobs) == {"j0", "j1", "j2", "j-new"}
            reply = await producer.client("q").call("claim", workers=["w#0", "w#1"], node="w")
            assert len(reply["jobs"]) == 2
    finally:
        await b.stop()
        await a.stop()


async def test_leader_that_cannot_renew_steps_down_then_recovers():
    mesh, storage = LocalMesh(), MemoryStorage(durable=True, shared=True)
    a, b = await two_replicas(mesh, storage, ha_lease_s=0.6)
    try:
        await a.enqueue("q", {"i": 0}, job_id="j0")
        storage.available = False  # the store goes away for longer than ha_lease_s
        await until(lambda: not a.is_active_owner("q"), timeout_s=3.0)
        assert not b.is_active_owner("q")  # nobody can lead without the store
        storage.available = True
        await until(lambda: a.is_active_owner("q") or b.is_active_owner("q"), timeout_s=3.0)
        leader = a if a.is_active_owner("q") else b
        assert set(leader.owners["q"].state.jobs) == {"j0"}
        assert leader.elections["q"].epoch == 2
    finally:
        await b.stop()
        await a.stop()


async def test_partitioned_leader_that_still_renews_keeps_its_lease():
    cut = Cut()
    mesh, storage = LocalMesh(cut), MemoryStorage(durable=True, shared=True)
    # A lease far longer than a renewal interval: a loaded machine's loop stall is no lapse.
    a, b = await two_replicas(mesh, storage, ha_lease_s=2.0)
    try:
        await until(lambda: len(b.elections["q"].alive) == 2)
        cut.cut.add(frozenset(("a", "b")))
        mesh.refresh_liveliness()
        await until(lambda: b.elections["q"].alive == {b.elections["q"].candidate})
        # Nothing may happen, so nothing to wait for: watch for longer than a whole lease
        # (and many of b's steal checks), during which a keeps renewing.
        await asyncio.sleep(2.5)
        assert a.is_active_owner("q") and not b.is_active_owner("q")
        lease = await storage.read_leader(LEASE)
        assert lease is not None and lease.epoch == 1
    finally:
        await b.stop()
        await a.stop()


async def test_dead_leader_is_replaced_without_waiting_for_its_lease():
    mesh, storage = LocalMesh(), MemoryStorage(durable=True, shared=True)
    a = replica(mesh, "a", storage, ha_lease_s=30.0)
    b = replica(mesh, "b", storage, ha_lease_s=30.0)
    await a.start()
    await until(lambda: a.is_active_owner("q"))
    await b.start()
    try:
        await a.enqueue("q", {"i": 0}, job_id="j0")
        await until(lambda: len(b.elections["q"].alive) == 2)
        loop = asyncio.get_running_loop()
        killed_at = loop.time()
        a.kill()  # a crash: no release; its token drops, its 30 s lease stays
        await until(lambda: b.is_active_owner("q"), timeout_s=5.0)
        assert loop.time() - killed_at < 5.0  # far below the 30 s storage lease
        assert set(b.owners["q"].state.jobs) == {"j0"}
        assert b.elections["q"].epoch == 2
    finally:
        await b.stop()


async def test_stand_in_refusal_does_not_hide_the_leaders_reply():
    """Both replicas bound during an overlap (b holds a stale epoch, as a resumed leader
    would): b's claim is fenced and answered with an error, which loses to a's ok reply."""
    mesh, storage = LocalMesh(), MemoryStorage(durable=True, shared=True)
    a, b = await two_replicas(mesh, storage)
    producer = Istos(transport=mesh.transport("p"), request_timeout_s=1.0)
    try:
        async with producer.serving():
            for i in range(4):
                await producer.enqueue("q", {"i": i}, job_id=f"j{i}")
            stale = await b._start_owner(b.queues["q"],
                                         fence=Fence(LEASE, 0, b.elections["q"].candidate))
            assert stale.running and len(stale.state.jobs) == 4
            got = []
            for n in range(4):
                reply = await producer.client("q").call("claim", workers=[f"w#{n}"], node="w")
                got += [j["job_id"] for j in reply["jobs"]]
            assert sorted(got) == ["j0", "j1", "j2", "j3"]  # every claim got the leader's reply
            assert not stale.running and stale.state.counts["leased"] == 0
            assert a.owners["q"].state.counts["leased"] == 4
    finally:
        await b.stop()
        await a.stop()

