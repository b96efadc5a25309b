"""A chord without ends whose member dead-letters: its owner records the stall in the chord's
barrier (durably), says so in a ``chord`` event and in ``why`` of the chord's members, and
``revive`` of that member clears it; all of it across an owner restart on durable storage."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import app_on, count, wait_events

from istos import Istos, JobEvent, MemoryStorage, protocol
from istos.core.chord_barrier import Barrier
from istos.ops.render import event_line, workflow_lines
from istos.tracefile import check_event

pytestmark = pytest.mark.fast  # `make check`: no process, server or session


def chord_events(events: list[JobEvent], change: str) -> list[JobEvent]:
    return [e for e in events if e.kind == "chord" and e.detail.get("change") == change]


def shard_worker(app: Istos, broken: set[int], hold: asyncio.Event) -> None:
    """Member 0 waits for ``hold`` (so it is still held, leased, while the chord stalls);
    members in ``broken`` raise."""
    @app.worker("shard", concurrency=4)
    async def shard(i):
        if i == 0:
            await hold.wait()
        if i in broken:
            raise RuntimeError(f"shard {i} is broken")
        return i + 1


def reducer(app: Istos) -> tuple[list[Any], asyncio.Event]:
    calls: list[Any] = []
    fired = asyncio.Event()

    @app.worker("reduce")
    async def reduce(body):
        calls.append(body)
        fired.set()

    return calls, fired


async def barrier_of(storage: MemoryStorage, chord_id: str) -> Barrier:
    raw = await storage.get("wf:shard", chord_id)
    assert raw is not None
    return Barrier.decode(raw)


async def why_flow(app: Istos, job_id: str) -> dict[str, Any]:
    return dict((await app.client("shard").call("why", job_id=job_id))["why"]["workflow"])


async def test_a_dead_member_stalls_its_chord_observably_and_revive_clears_it(mesh):
    storage = MemoryStorage(durable=True)
    owner = app_on(mesh, "owner", storage=storage)
    owner.queue("shard", max_attempts=1, admin=True)  # revive changes a job's fate
    owner.queue("reduce")
    worker = app_on(mesh, "worker")
    broken, hold = {2}, asyncio.Event()
    shard_worker(worker, broken, hold)
    calls, fired = reducer(worker)
    async with owner.serving(), worker.serving():
        chord_id = await owner.chord("shard", [0, 1, 2], callback=("reduce", "in"))
        dead = f"{chord_id}.2"
        events = await wait_events(owner, lambda ev: len(chord_events(ev, "stalled")) == 1)
        [stalled] = chord_events(events, "stalled")
        assert stalled.job_id == dead and stalled.queue == "shard"
        assert stalled.detail == {"chord_id": chord_id, "change": "stalled", "index": 2,
                                  "size": 3, "stalled_by": [2]}
        assert count(events, "dead_lettered", dead) == 1
        assert set((await barrier_of(storage, chord_id)).dead) == {2}  # stored
        # `why` of a member still running, and of the dead one, names the stall
        for job_id in (f"{chord_id}.0", dead):
            flow = await why_flow(worker, job_id)
            assert [m["index"] for m in flow["stalled"]["by"]] == [2]
            assert flow["stalled"]["by"][0]["state"] == "dead"
            assert "stalled by member 2" in flow["stalled"]["note"]
            assert "revive" in flow["stalled"]["note"]
        text = "\n".join(workflow_lines({**flow, "jobs": []}))
        assert f"stalled: chord {chord_id} is stalled by member 2" in text
        # the operator's readers take the event as any other (the events op, `istos follow`)
        listed = (await worker.client("shard").call("events"))["events"]
        [seen] = [e for e in listed if e["kind"] == "chord"]
        assert check_event(seen, "event")["detail"]["stalled_by"] == [2]
        assert tuple(seen["detail"]) == protocol.CHORD_EVENT
        assert seen["detail"]["change"] in protocol.CHORD_CHANGES
        assert event_line(seen).split()[1:] == ["chord", dead, "stalled"]
        broken.clear()
        assert await worker.revive("shard", dead) == dead
        # the barrier no longer lists it once revive answered
        assert (await barrier_of(storage, chord_id)).dead == {}
        assert "stalled" not in await why_flow(worker, f"{chord_id}.0")
        events = await wait_events(owner, lambda ev: len(chord_events(ev, "resumed")) == 1)
        assert chord_events(events, "resumed")[0].detail["stalled_by"] == []
        hold.set()
        await asyncio.wait_for(fired.wait(), 5.0)
        await wait_events(owner, lambda ev: count(ev, "acked", f"{chord_id}.0") == 1)
    assert calls == [{"results": [1, 2, 3], "input": "in"}]
    assert count(owner.events.recent(), "enqueued", f"{chord_id}.callback") == 1
    assert len(chord_events(owner.events.recent(), "stalled")) == 1  # said once


async def test_the_stall_survives_an_owner_restart_and_revive_clears_it(mesh):
    storage = MemoryStorage(durable=True)
    cb_app = app_on(mesh, "callbacks")
    cb_app.queue("reduce")
    calls, fired = reducer(cb_app)
    worker = app_on(mesh, "worker")
    broken, hold = {1}, asyncio.Event()
    shard_worker(worker, broken, hold)
    async with cb_app.serving(), worker.serving():
        owner1 = app_on(mesh, "owner1", storage=storage)
        owner1.queue("shard", max_attempts=1, admin=True)
        async with owner1.serving():
            chord_id = await owner1.chord("shard", [0, 1, 2], callback=("reduce", None))
            await wait_events(owner1, lambda ev: len(chord_events(ev, "stalled")) == 1
                              and count(ev, "acked") == 1)
        dead = f"{chord_id}.1"
        owner2 = app_on(mesh, "owner2", storage=storage)
        owner2.queue("shard", max_attempts=1, admin=True)
        async with owner2.serving():
            assert owner2.owners["shard"].state.jobs[dead].state == "dead"  # recovered
            flow = await why_flow(worker, f"{chord_id}.0")  # leased, from before the restart
            assert [m["job_id"] for m in flow["stalled"]["by"]] == [dead]
            assert (await barrier_of(storage, chord_id)).stalled_by() == [1]
            broken.clear()
            await worker.revive("shard", dead)
            assert (await barrier_of(storage, chord_id)).dead == {}
            assert "stalled" not in await why_flow(worker, f"{chord_id}.0")
            await wait_events(owner2, lambda ev: len(chord_events(ev, "resumed")) == 1)
            hold.set()
            await asyncio.wait_for(fired.wait(), 5.0)
            await wait_events(owner2, lambda ev: count(ev, "acked") == 2)
    assert calls == [{"results": [1, 2, 3], "input": None}]
    assert count(cb_app.events.recent(), "enqueued", f"{chord_id}.callback") == 1
    assert chord_events(owner2.events.recent(), "stalled") == []  # recorded once, by owner1


async def test_a_restarted_owner_records_a_death_its_predecessor_did_not(mesh):
    """A crash between a member's dead letter and the stall's write: the next owner of the
    queue finds the dead member unlisted (its barrier is put back without it here) and
    records it."""
    storage = MemoryStorage(durable=True)
    owner1 = app_on(mesh, "owner1", storage=storage)
    owner1.queue("shard", max_attempts=1)
    owner1.queue("reduce")
    worker = app_on(mesh, "worker")
    hold = asyncio.Event()
    shard_worker(worker, {2}, hold)
    async with worker.serving():
        async with owner1.serving():
            chord_id = await owner1.chord("shard", [0, 1, 2], callback=("reduce", None))
            await wait_events(owner1, lambda ev: len(chord_events(ev, "stalled")) == 1)
        unlisted = await barrier_of(storage, chord_id)
        unlisted.dead = {}
        await storage.put("wf:shard", chord_id, unlisted.encode())
        owner2 = app_on(mesh, "owner2", storage=storage)
        owner2.queue("shard", max_attempts=1)
        owner2.queue("reduce")
        async with owner2.serving():
            events = await wait_events(owner2,
                                       lambda ev: len(chord_events(ev, "stalled")) == 1)
            assert chord_events(events, "stalled")[0].job_id == f"{chord_id}.2"
            assert (await barrier_of(storage, chord_id)).stalled_by() == [2]
            hold.set()
            await wait_events(owner2, lambda ev: count(ev, "acked", f"{chord_id}.0") == 1)


async def test_redriving_every_dead_letter_clears_a_stall_of_two_members(mesh):
    storage = MemoryStorage(durable=True)
    owner = app_on(mesh, "owner", storage=storage)
    owner.queue("shard", max_attempts=1, admin=True)
    owner.queue("reduce")
    worker = app_on(mesh, "worker")
    broken, hold = {1, 3}, asyncio.Event()
    shard_worker(worker, broken, hold)
    calls, fired = reducer(worker)
    async with owner.serving(), worker.serving():
        chord_id = await owner.chord("shard", [0, 1, 2, 3], callback=("reduce", None))
        events = await wait_events(owner, lambda ev: len(chord_events(ev, "stalled")) == 2)
        assert sorted(e.detail["index"] for e in chord_events(events, "stalled")) == [1, 3]
        assert chord_events(events, "stalled")[-1].detail["stalled_by"] == [1, 3]
        flow = await why_flow(worker, f"{chord_id}.0")
        assert flow["stalled"]["count"] == 2 and "by member 1 " in flow["stalled"]["note"]
        broken.clear()
        reply = await worker.client("shard").call("requeue_all_dead")  # istos redrive-dead
        assert reply["requeued"] == 2
        await wait_events(owner, lambda ev: len(chord_events(ev, "resumed")) == 2)
        assert (await barrier_of(storage, chord_id)).dead == {}
        hold.set()
        await asyncio.wait_for(fired.wait(), 5.0)
    assert calls == [{"results": [1, 2, 3, 4], "input": None}]


async def test_a_purged_dead_member_leaves_its_chord_stalled_for_good_and_why_says_so(mesh):
    owner = app_on(mesh, "owner")
    owner.queue("shard", max_attempts=1, admin=True)
    owner.queue("reduce")
    worker = app_on(mesh, "worker")
    hold = asyncio.Event()
    shard_worker(worker, {2}, hold)
    reducer(worker)
    async with owner.serving(), worker.serving():
        chord_id = await owner.chord("shard", [0, 1, 2], callback=("reduce", None))
        await wait_events(owner, lambda ev: len(chord_events(ev, "stalled")) == 1)
        await worker.client("shard").call("purge_dead", job_ids=[f"{chord_id}.2"])
        flow = await why_flow(worker, f"{chord_id}.0")
        hold.set()
    assert flow["stalled"]["by"][0]["state"] == "unknown"
    assert "nothing can resume the chord" in flow["stalled"]["note"]


async def test_a_cancelled_member_stalls_its_chord_for_good_and_says_so(mesh):
    """A member cancelled while it waits: the barrier records it (``cancelled``), a ``chord``
    event and ``why`` say the chord is stalled and that nothing resumes it (it is named before
    a dead member, which revive could bring back); reviving the dead one does not fire the
    callback, and a restarted owner still says so."""
    storage = MemoryStorage(durable=True)
    owner1 = app_on(mesh, "owner1", storage=storage)
    owner1.queue("shard", max_attempts=1, admin=True)
    owner1.queue("reduce")
    worker = app_on(mesh, "worker")
    hold, broken = asyncio.Event(), {1}
    ran: list[int] = []

    @worker.worker("shard", concurrency=1, prefetch=0)  # members 1 and 2 wait behind 0
    async def shard(i):
        ran.append(i)
        if i == 0:
            await hold.wait()
        if i in broken:
            raise RuntimeError(f"shard {i} is broken")
        return i

    calls, _ = reducer(worker)
    async with worker.serving():
        async with owner1.serving():
            chord_id = await owner1.chord("shard", [0, 1, 2], callback=("reduce", None))
            member = f"{chord_id}.2"
            await wait_events(owner1, lambda ev: count(ev, "claimed", f"{chord_id}.0") == 1)
            assert await owner1.cancel("shard", member) == "cancelled"
            events = await wait_events(owner1,
                                       lambda ev: len(chord_events(ev, "stalled")) == 1)
            [stalled] = chord_events(events, "stalled")
            assert stalled.job_id == member
            assert stalled.detail == {"chord_id": chord_id, "change": "stalled", "index": 2,
                                      "size": 3, "stalled_by": [2]}
            assert set((await barrier_of(storage, chord_id)).cancelled) == {2}  # stored
            hold.set()  # member 0 is done, member 1 dies
            await wait_events(owner1, lambda ev: len(chord_events(ev, "stalled")) == 2)
            flow = await why_flow(worker, member)
            assert [(m["index"], m["state"]) for m in flow["stalled"]["by"]] == [
                (1, "dead"), (2, "cancelled")]
            note = flow["stalled"]["note"]  # the member nothing brings back comes first
            assert "stalled by member 2" in note and "cancelled" in note
            assert "will not fire" in note
            broken.clear()
            await worker.revive("shard", f"{chord_id}.1")
            events = await wait_events(
                owner1, lambda ev: len(chord_events(ev, "resumed")) == 1
                and count(ev, "acked", f"{chord_id}.1") == 1)
            assert chord_events(events, "resumed")[0].detail["stalled_by"] == [2]
        owner2 = app_on(mesh, "owner2", storage=storage)
        owner2.queue("shard", max_attempts=1, admin=True)
        owner2.queue("reduce")
        async with owner2.serving():
            assert owner2.owners["shard"].state.jobs[member].state == "cancelled"
            flow = await why_flow(worker, member)
            assert [m["index"] for m in flow["stalled"]["by"]] == [2]
            assert "cancelled" in flow["stalled"]["note"]
            assert chord_events(owner2.events.recent(), "stalled") == []  # recorded once
    assert sorted(ran) == [0, 1, 1]  # the cancelled member never ran
    assert calls == []  # nor did the callback
