"""Dedup windows: ``enqueue(..., job_id=ID, dedup_s=...)`` keeps the id reserved after the job
finished. Pure state, every storage (across an owner restart and a new owner node), real
Zenoh (enqueue, coalesced enqueues and enqueue_many), and the simulator with its invariant."""

from __future__ import annotations

import asyncio
import random

import pytest
import test_durable
from helpers import count, wait_events
from zenoh_util import isolated_configs, unique_prefix

from istos import ConfigError, Istos, MemoryStorage
from istos.clock import ManualClock
from istos.core.dedup import DedupMark
from istos.core.state import QueuePolicy, QueueState
from istos.transport.local import LocalMesh
from istos_nb.sim import Simulation

storage_factory = test_durable.storage_factory  # the fixture: memory, Redis, PostgreSQL, SQLite


def _run_once(state: QueueState, job_id: str, now: float) -> None:
    (rec,) = state.claim(["w"], now)
    assert rec.job_id == job_id
    assert state.ack(job_id, rec.lease_token, now) == "ok"


def test_pure_window_reserves_the_id_after_the_ack_then_lets_go():
    state = QueueState("q", QueuePolicy())
    assert state.enqueue("order-42", b"x", 0.0, dedup_s=10.0)
    _run_once(state, "order-42", 1.0)
    dirty, events = state.drain()
    assert DedupMark("order-42", 11.0) in dirty  # written in place of the record's delete
    assert "order-42" not in dirty
    assert not state.jobs and state.holds("order-42", 5.0) and not state.holds("order-42")
    assert not state.enqueue("order-42", b"y", 10.9)
    _, events = state.drain()
    assert [e.kind for e in events] == ["duplicate_enqueue"]
    assert events[0].detail == {"dedup_until": 11.0}
    assert not state.jobs
    state.sweep(11.0)
    dirty, _ = state.drain()
    assert dirty == ["order-42"]  # the ended window's mark is deleted from storage
    assert state.enqueue("order-42", b"y", 11.0)


def test_pure_window_counts_from_the_finish_of_a_dead_or_expired_job():
    state = QueueState("q", QueuePolicy(max_attempts=1, keep_results=True, result_ttl_s=5.0))
    state.enqueue("a", b"x", 0.0, dedup_s=20.0)
    (rec,) = state.claim(["w"], 1.0)
    state.nack("a", rec.lease_token, 2.0, "boom", random.Random(0))
    assert state.purge_dead(3.0) == 1
    assert state.holds("a", 21.9) and not state.holds("a", 22.0)  # from its death at t=2
    state.enqueue("b", b"x", 0.0, dedup_s=20.0)
    _run_once(state, "b", 1.0)  # done, result kept until t=6: held as a job till then
    state.sweep(6.0)
    assert "b" not in state.jobs and state.holds("b", 20.9) and not state.holds("b", 21.0)
    state.enqueue("c", b"x", 0.0)  # no window: forgotten as before
    _run_once(state, "c", 1.0)
    state.sweep(6.0)
    assert not state.holds("c", 6.0)


def test_pure_new_job_after_the_window_is_never_deleted_by_a_late_sweep():
    state = QueueState("q", QueuePolicy())
    state.enqueue("a", b"x", 0.0, dedup_s=1.0)
    _run_once(state, "a", 0.0)
    assert state.enqueue("a", b"x", 1.0, dedup_s=1.0)  # the window ended, not yet swept
    state.drain()
    state.sweep(5.0)
    dirty, _ = state.drain()
    assert "a" not in dirty and "a" in state.jobs


def test_producer_checks_the_window():
    app = Istos(transport=LocalMesh().transport("p"))
    for bad in (-1, float("nan"), "600", True, 1e12):
        with pytest.raises(ConfigError, match="dedup_s"):
            asyncio.run(app.enqueue("q", 1, job_id="x", dedup_s=bad))
    with pytest.raises(ConfigError, match="needs a job_id"):
        asyncio.run(app.enqueue("q", 1, dedup_s=60))
    with pytest.raises(ConfigError, match="needs a job_id"):
        asyncio.run(app.enqueue_many("q", [1], dedup_s=60))


async def test_window_on_every_storage_survives_restart_and_a_new_owner(storage_factory):
    mesh = LocalMesh()
    first = Istos(storage=storage_factory(), transport=mesh.transport("owner-1"))
    first.queue("q")
    worker = Istos(transport=mesh.transport("w"))
    runs: list[str] = []

    @worker.worker("q", concurrency=2)
    async def handle(job):
        runs.append(job["order"])

    async with worker.serving():
        async with first.serving():
            assert await first.enqueue("q", {"order": 42}, job_id="order-42",
                                       dedup_s=600) == "order-42"
            ids = await first.enqueue_many("q", [{"order": 1}, {"order": 2}],
                                           job_ids=["o-1", "o-2"], dedup_s=600)
            await wait_events(first, lambda ev: count(ev, "acked") == 3, 20.0)
            assert await first.enqueue("q", {"order": 42}, job_id="order-42",
                                       dedup_s=600) == "order-42"
            assert await first.enqueue_many("q", [{"order": 1}], job_ids=["o-1"]) == ["o-1"]
            stats = first.owners["q"].state.counts
            assert stats["ready"] == stats["leased"] == 0
        durable = first.node.storage.durable
        if not durable:  # in-memory storage: the window is the owner's RAM only
            return
        second = Istos(storage=storage_factory(), transport=mesh.transport("owner-2"))
        second.queue("q")
        async with second.serving():
            for jid, order in (("order-42", 42), ("o-1", 1), ("o-2", 2)):
                await second.enqueue("q", {"order": order}, job_id=jid, dedup_s=600)
            events = await wait_events(second, lambda ev: count(ev, "duplicate_enqueue") == 3,
                                       20.0)
            assert count(events, "enqueued") == 0
            # an id without a window is accepted again as soon as its job is gone
            await second.enqueue("q", {"order": 7}, job_id="o-7")
            await wait_events(second, lambda ev: count(ev, "acked", "o-7") == 1, 20.0)
    assert sorted(runs) == [1, 2, 7, 42] and ids == ["o-1", "o-2"]


async def test_window_ends_on_time_in_process():
    # The window runs on a clock the test moves: on the loop's clock a loaded machine could
    # let the whole 0.3 s window pass before the enqueue meant to land inside it.
    mesh, clock = LocalMesh(), ManualClock()
    owner = Istos(transport=mesh.transport("owner"), clock=clock)
    owner.queue("q", sweep_interval_s=0.05)
    worker = Istos(transport=mesh.transport("w"))

    @worker.worker("q")
    async def handle(job):
        return None

    async with owner.serving(), worker.serving():
        await owner.enqueue("q", 1, job_id="a", dedup_s=0.3)
        first = await wait_events(owner, lambda ev: count(ev, "acked", "a") == 1)
        acked_at = next(e.t for e in first if e.kind == "acked")
        await owner.enqueue("q", 1, job_id="a", dedup_s=0.3)  # inside: refused
        clock.t = acked_at + 0.29
        await owner.enqueue("q", 1, job_id="a", dedup_s=0.3)  # still inside: refused
        clock.t = acked_at + 0.31  # the window has passed
        await owner.enqueue("q", 1, job_id="a", dedup_s=0.3)
        events = await wait_events(owner, lambda ev: count(ev, "acked", "a") == 2)
    enqueued = [e for e in events if e.kind == "enqueued" and e.job_id == "a"]
    assert len(enqueued) == 2 and enqueued[1].t >= acked_at + 0.3
    assert count(events, "duplicate_enqueue", "a") == 2


async def test_window_over_zenoh_from_a_remote_producer():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    producer = Istos(zenoh=configs[1], prefix=prefix, node_id="producer")
    runs: list[int] = []

    @producer.worker("q", poll_interval_s=0.2)
    async def handle(job):
        runs.append(job)

    async with owner.serving(), producer.serving():
        await producer.enqueue("q", 1, job_id="a", dedup_s=600)
        await producer.enqueue_many("q", [2, 3], job_ids=["b", "c"], dedup_s=600)
        await wait_events(owner, lambda ev: count(ev, "acked") == 3, 30.0)
        again = await asyncio.gather(  # one loop turn: coalesced into enqueue_many
            *(producer.enqueue("q", n, job_id=j, dedup_s=600)
              for n, j in ((1, "a"), (2, "b"), (3, "c"))))
        assert again == ["a", "b", "c"]
        await producer.enqueue_many("q", [1, 2], job_ids=["a", "b"], dedup_s=600)
        events = await wait_events(owner, lambda ev: count(ev, "duplicate_enqueue") == 5, 30.0)
    assert count(events, "enqueued") == 3 and sorted(runs) == [1, 2, 3]


def _resend_sim(seed: int, storage: str) -> Simulation:
    sim = Simulation(seed=seed, storage=storage)
    owner = sim.node("owner")
    owner.queue("q", lease_s=5.0)
    w = sim.node("w")

    @w.worker("q", concurrency=2)
    async def handle(job):
        await asyncio.sleep(0.5)

    for i in range(20):  # each order sent, then resent at 10 s and after an owner restart
        for t in (float(i), 10.0 + i, 60.0 + i):
            sim.at(t, owner.enqueue, "q", {"order": i}, job_id=f"order-{i}", dedup_s=600.0)
    sim.restart("owner", at=40.0)
    return sim


def test_simulated_resends_inside_the_window_run_once_across_a_restart():
    result = _resend_sim(5, "durable").run(until=200.0)
    report = result.check()
    assert report["ok"].all(), report
    assert result.counts["duplicated"] == 0 and result.counts["lost"] == 0
    assert len(result.effects) == 20  # every order ran once, resends (60 sends) or not
    kinds = [e["kind"] for e in result.events_raw]
    assert kinds.count("enqueued") == 20 and kinds.count("duplicate_enqueue") == 40


def test_checker_catches_a_second_job_inside_the_window(monkeypatch):
    """The invariant can fail: an owner that forgets its marks at once."""
    from istos.core.dedup import DedupMarks

    monkeypatch.setattr(DedupMarks, "holds", lambda self, job_id, now: False)
    report = _resend_sim(5, "durable").run(until=200.0).check().set_index("invariant")
    assert not report.loc["no second job for an id inside its dedup window", "ok"]


async def test_window_survives_an_ha_failover():
    mesh, storage = LocalMesh(), MemoryStorage(durable=True, shared=True)
    replicas = []
    for name in ("a", "b"):
        app = Istos(storage=storage, transport=mesh.transport(name), node_id=name,
                    request_timeout_s=1.0)
        app.queue("q", ha=True, ha_lease_s=0.6, sweep_interval_s=0.05)
        replicas.append(app)
    a, b = replicas
    producer = Istos(transport=mesh.transport("p"), request_timeout_s=1.0)

    @producer.worker("q", poll_interval_s=0.05)
    async def handle(job):
        return None

    async def leader_is(app: Istos) -> None:
        async def loop() -> None:
            while not app.is_active_owner("q"):
                await asyncio.sleep(0.01)  # leadership is the election task's side effect
        await asyncio.wait_for(loop(), 10.0)

    await a.start()
    await leader_is(a)
    await b.start()
    try:
        async with producer.serving():
            await producer.enqueue("q", 1, job_id="order-1", dedup_s=600)
            await wait_events(a, lambda ev: count(ev, "acked", "order-1") == 1, 10.0)
            await a.stop()  # a clean stop hands the leadership over at once
            await leader_is(b)
            assert "order-1" not in b.owners["q"].state.jobs
            assert b.owners["q"].state.holds("order-1", b.node.clock.now())
            assert await producer.enqueue("q", 1, job_id="order-1", dedup_s=600) == "order-1"
            events = await wait_events(b, lambda ev: count(ev, "duplicate_enqueue") == 1)
            assert count(events, "enqueued") == 0
    finally:
        await b.stop()
        await a.stop()
