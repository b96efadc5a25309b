"""Start deadlines: ``enqueue(..., expires_s=...)`` or ``start_by=``: a job no worker started by
then ends ``expired``, never run and never dead-lettered. Pure state, every storage (across an
owner restart), a prefetched job handed back unrun, real Zenoh (app, enqueue_many,
SyncProducer) and bad input."""

from __future__ import annotations

import asyncio
import datetime as dt
import random
from typing import Any

import pytest
import test_durable
from helpers import count, wait_events
from zenoh_util import isolated_configs, unique_prefix

from istos import ConfigError, InvalidJob, Istos, MemoryStorage, SyncProducer
from istos.clock import ManualClock
from istos.core.expiry import EXPIRED_ERROR, check_deadline, claim_start_by, start_deadline
from istos.core.records import JobRecord
from istos.core.state import EXPIRED, READY, QueuePolicy, QueueState
from istos.ops.render import why_text
from istos.transport.local import LocalMesh

storage_factory = test_durable.storage_factory  # memory (durable), Redis, PostgreSQL, SQLite


# -- pure ------------------------------------------------------------------------------------
@pytest.mark.fast
def test_pure_a_job_past_its_deadline_is_never_handed_out():
    state = QueueState("q", QueuePolicy(result_ttl_s=60.0))
    state.enqueue("late", b"x", 0.0, start_by=5.0)
    state.enqueue("plain", b"y", 0.0)
    assert state.next_deadline() == 5.0
    state.drain()
    got = state.claim(["w0", "w1"], 5.0)  # at the deadline: expired first, then claimed
    assert [r.job_id for r in got] == ["plain"]
    rec = state.jobs["late"]
    assert rec.state == EXPIRED and rec.last_error == EXPIRED_ERROR and rec.attempts == 0
    assert rec.expires_at == 65.0 and state.counts[EXPIRED] == 1 and state.counts[READY] == 0
    dirty, events = state.drain()
    assert rec in dirty
    assert [(e.kind, e.job_id, e.detail) for e in events if e.kind == "expired"] == \
        [("expired", "late", {"start_by": 5.0})]
    state.sweep(65.0)  # kept like a done job, then forgotten
    assert "late" not in state.jobs


@pytest.mark.fast
def test_pure_the_sweep_expires_delayed_and_ready_jobs_in_deadline_order():
    state = QueueState("q", QueuePolicy())
    state.enqueue("d", b"x", 0.0, delay_s=10.0, start_by=4.0)
    state.enqueue("r", b"x", 0.0, start_by=2.0)
    state.paused = True  # nobody claims: only the sweep ends them
    state.drain()
    state.sweep(1.9)
    assert state.drain()[1] == []
    state.sweep(4.0)
    assert [e.job_id for e in state.drain()[1] if e.kind == "expired"] == ["r", "d"]
    assert state.next_deadline() == 3604.0  # only the kept records' end is left


@pytest.mark.fast
def test_pure_a_handed_back_job_expires_a_started_one_does_not():
    state = QueueState("q", QueuePolicy(max_attempts=3))
    state.enqueue("a", b"x", 0.0, start_by=10.0)
    state.enqueue("b", b"x", 0.0, start_by=10.0)
    a, b = state.claim(["w0", "w1"], 1.0)
    assert claim_start_by(a) == 10.0
    assert state.release("a", a.lease_token, 11.0) == "ok"  # prefetched, handed back unrun
    state.nack("b", b.lease_token, 2.0, "boom", random.Random(0))  # it ran: retried later
    state.sweep(20.0)
    assert state.jobs["a"].state == EXPIRED
    assert state.jobs["b"].state != EXPIRED
    (again,) = state.claim(["w2"], 30.0)
    assert again.job_id == "b" and claim_start_by(again) is None


@pytest.mark.fast
def test_pure_a_failed_expiry_write_rolls_back_and_the_deadline_holds_again():
    state = QueueState("q", QueuePolicy())
    state.track_undo()
    state.enqueue("a", b"x", 0.0, start_by=1.0)
    state.drain()
    state.take_undo()
    state.sweep(2.0)
    assert state.jobs["a"].state == EXPIRED
    state.rollback(state.take_undo())
    assert state.jobs["a"].state == READY and state.next_deadline() == 1.0
    state.sweep(3.0)
    assert state.jobs["a"].state == EXPIRED


@pytest.mark.fast
def test_pure_restored_records_keep_their_deadline():
    old = QueueState("q", QueuePolicy())
    old.enqueue("a", b"x", 0.0, start_by=7.0)
    (rec,) = old.drain()[0]
    assert isinstance(rec, JobRecord)
    fresh = QueueState("q", QueuePolicy())
    fresh.restore(JobRecord.from_dict(rec.to_dict()), 1.0)
    assert fresh.next_deadline() == 7.0
    assert fresh.claim(["w"], 7.0) == [] and fresh.jobs["a"].state == EXPIRED


@pytest.mark.fast
def test_deadline_arguments_are_checked_naming_the_field():
    utc = dt.timezone.utc
    assert check_deadline(None, None, 0.0, 100.0) == (None, None)
    assert check_deadline(5, None, 0.0, 100.0) == (5.0, None)
    assert check_deadline(None, dt.datetime.fromtimestamp(200.0, utc), 0.0, 100.0) == \
        (None, 200.0)
    assert check_deadline(None, 150, 0.0, 100.0) == (None, 150.0)
    bad: list[tuple[Any, Any, float, str]] = [
        (-1, None, 0.0, "expires_s"), (0, None, 0.0, "expires_s"),
        (float("nan"), None, 0.0, "expires_s"), (float("inf"), None, 0.0, "expires_s"),
        ("5", None, 0.0, "expires_s"), (True, None, 0.0, "expires_s"),
        (1e12, None, 0.0, "expires_s"), (5, None, 5.0, "expires_s"),
        (5, 200.0, 0.0, "start_by"),  # both
        (None, "tomorrow", 0.0, "start_by"), (None, dt.datetime(2030, 1, 1), 0.0, "start_by"),
        (None, 50.0, 0.0, "start_by"), (None, 120.0, 30.0, "start_by"),
        (None, float("inf"), 0.0, "start_by"), (None, dt.date(2030, 1, 1), 0.0, "start_by")]
    for expires_s, start_by, delay, field in bad:
        with pytest.raises(ConfigError, match=field):
            check_deadline(expires_s, start_by, delay, 100.0)
    assert start_deadline(3.5) == 3.5
    assert all(start_deadline(v) is None for v in (None, "3", True, float("nan"), [1]))


def test_producer_refuses_bad_deadlines_before_sending():
    app = Istos(transport=LocalMesh().transport("p"))
    for kw in ({"expires_s": -1}, {"expires_s": float("nan")}, {"expires_s": 2, "delay_s": 3},
               {"start_by": "soon"}, {"expires_s": 5, "start_by": dt.datetime.now(dt.UTC)}):
        field = "start_by" if "start_by" in kw else "expires_s"
        with pytest.raises(ConfigError, match=field):
            asyncio.run(app.enqueue("q", 1, **kw))
        with pytest.raises(ConfigError, match=field):
            asyncio.run(app.enqueue_many("q", [1], **kw))


# -- in process, every storage -----------------------------------------------------------------
def _owner(mesh: LocalMesh, name: str, storage: Any) -> Istos:
    app = Istos(storage=storage, transport=mesh.transport(name), node_id=name)
    app.queue("q", admin=True, sweep_interval_s=0.05)
    return app


async def test_expiry_on_every_storage_survives_an_owner_restart(storage_factory):
    mesh = LocalMesh()
    first = _owner(mesh, "owner-1", storage_factory())
    async with first.serving():
        await first.pause("q", reason="hold everything")  # nobody claims: they wait
        await first.enqueue("q", 1, job_id="soon", expires_s=0.2)
        await first.enqueue_many("q", [2], job_ids=["later"], expires_s=600)
        events = await wait_events(first, lambda ev: count(ev, "expired", "soon") == 1, 20.0)
        assert count(events, "expired") == 1
        result = await first.result("q", "soon")
        assert result == {"state": "expired", "result": None, "error": EXPIRED_ERROR}
        stats = first.owners["q"].stats()
        assert stats["counts"][EXPIRED] == 1
        why = await first.client("q").call("why", job_id="soon")
        assert why["why"]["reason"].startswith("expired, never run")
        assert "start deadline" in why_text("soon", why["why"])  # istos why shows it
    if not first.node.storage.durable:
        return
    second = _owner(mesh, "owner-2", storage_factory())
    async with second.serving():
        assert (await second.result("q", "soon"))["state"] == "expired"
        later = second.owners["q"].state.jobs["later"]
        assert later.state == READY and later.start_by is not None
        await second.resume("q")
        await second.enqueue("q", 3, job_id="late-again", start_by=second.node.clock.now() + 0.2)
        await wait_events(second, lambda ev: count(ev, "expired", "late-again") == 1, 20.0)
        assert (await second.result("q", "later"))["state"] == "ready"


async def test_a_prefetched_job_past_its_deadline_is_handed_back_and_expires():
    # Deadlines pass when the test moves the clock: on the loop's clock a loaded machine could
    # let "late" expire before it was ever prefetched (no claim to hand back).
    mesh, clock = LocalMesh(), ManualClock()
    owner = Istos(storage=MemoryStorage(), transport=mesh.transport("owner"), node_id="owner",
                  clock=clock)
    owner.queue("q", admin=True, sweep_interval_s=0.05)
    worker = Istos(transport=mesh.transport("w"), node_id="w", clock=clock)
    running, release = asyncio.Event(), asyncio.Event()
    runs: list[str] = []

    @worker.worker("q", concurrency=1, prefetch=1, poll_interval_s=0.05)
    async def handle(job: str) -> None:
        runs.append(job)
        if job == "blocker":
            running.set()
            await release.wait()

    async with owner.serving(), worker.serving():
        await owner.enqueue("q", "blocker", job_id="blocker")
        await asyncio.wait_for(running.wait(), 10.0)
        await owner.enqueue("q", "late", job_id="late", expires_s=0.5)
        await wait_events(owner, lambda ev: count(ev, "claimed", "late") == 1, 10.0)
        start_by = owner.owners["q"].state.jobs["late"].start_by
        assert start_by is not None
        clock.t = start_by + 0.05  # its start deadline passes while it waits behind the blocker
        release.set()
        events = await wait_events(owner, lambda ev: count(ev, "expired", "late") == 1, 10.0)
        assert worker.runners[0].stats.not_started == 1
    assert runs == ["blocker"]
    kinds = [e.kind for e in events if e.job_id == "late"]
    assert kinds[-2:] == ["retry_scheduled", "expired"] and "acked" not in kinds


# -- real Zenoh ---------------------------------------------------------------------------------
async def test_deadlines_over_zenoh_from_an_app_and_a_sync_producer():
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q", admin=True, sweep_interval_s=0.05, keep_results=True)
    remote = Istos(zenoh=configs[1], prefix=prefix, node_id="remote")
    async with owner.serving(), remote.serving():
        await remote.pause("q", reason="let them expire")
        utc = dt.timezone.utc
        await remote.enqueue("q", 1, job_id="a", start_by=dt.datetime.now(utc)
                             + dt.timedelta(seconds=0.3))
        await remote.enqueue_many("q", [2, 3], job_ids=["b", "c"], expires_s=0.3)

        def sync_side() -> tuple[str, list[str]]:
            with SyncProducer(configs[2], prefix=prefix) as producer:
                return (producer.enqueue("q", 4, job_id="d", expires_s=0.3),
                        producer.enqueue_many("q", [5], job_ids=["e"], expires_s=0.3))

        assert await asyncio.to_thread(sync_side) == ("d", ["e"])
        await wait_events(owner, lambda ev: count(ev, "expired") == 5, 20.0)
        for jid in "abcde":
            assert (await remote.result("q", jid))["state"] == "expired"
        stats = (await remote.client("q").call("stats"))["stats"]
        assert stats["counts"]["expired"] == 5 and stats["totals"]["expired"] == 5


async def test_hostile_deadline_fields_are_refused_before_anything_changes():
    app = Istos(storage=MemoryStorage(durable=True, shared=True),
                transport=LocalMesh().transport("o"))
    app.queue("q")
    async with app.serving():
        owner = app.owners["q"]
        for bad in ({"expires_s": -1.0}, {"expires_s": "1"}, {"start_by": float("inf")},
                    {"start_by": [1]}, {"expires_s": 1.0, "start_by": 1e9}):
            reply = await owner.dispatch({"v": 1, "op": "enqueue", "body": b"\x01",
                                          "job_id": "h", **bad}, role="produce")
            assert reply["ok"] is False and reply["error"] == InvalidJob.__name__, reply
            item = {"body": b"\x01", "job_id": "h", **bad}
            reply = await owner.dispatch({"v": 1, "op": "enqueue_many", "items": [item]},
                                         role="produce")
            assert reply["ok"] is False, reply
        assert not owner.state.jobs


async def test_pause_and_deadlines_over_zenoh_across_an_owner_restart(storage_factory):
    """Real Zenoh on every storage: a remote producer pauses the queue and enqueues jobs with
    start deadlines; the owner restarts on the same storage; the pause holds, the deadline
    is kept and the job expires on the new owner, never run."""
    configs, prefix = isolated_configs(3), unique_prefix()
    remote = Istos(zenoh=configs[0], prefix=prefix, node_id="remote")
    runs: list[int] = []

    @remote.worker("q", poll_interval_s=0.2)
    async def handle(job: int) -> None:
        runs.append(job)

    def owner_on(config: dict[str, Any], name: str) -> Istos:
        app = Istos(zenoh=config, prefix=prefix, node_id=name, storage=storage_factory())
        app.queue("q", admin=True, sweep_interval_s=0.05)
        return app

    async with remote.serving():
        first = owner_on(configs[1], "owner-1")
        async with first.serving():
            await remote.pause("q", reason="maintenance")
            await remote.enqueue("q", 1, job_id="short", expires_s=2.0)
            await remote.enqueue("q", 2, job_id="long", expires_s=600)
        if not first.node.storage.durable:
            return
        second = owner_on(configs[2], "owner-2")
        async with second.serving():
            stats = (await remote.client("q").call("stats"))["stats"]
            assert stats["paused"] and stats["pause"]["reason"] == "maintenance"
            assert stats["pause"]["by"] == "remote"
            if second.owners["q"].state.jobs["short"].state != EXPIRED:  # (a slow machine:
                # the first owner may have expired it already; then it loaded expired)
                await wait_events(second, lambda ev: count(ev, "expired", "short") == 1, 20.0)
            assert (await remote.result("q", "short"))["state"] == "expired"
            assert await remote.resume("q")
            await wait_events(second, lambda ev: count(ev, "acked", "long") == 1, 20.0)
    assert runs == [2]


@pytest.mark.parametrize("storage_factory", ["redis", "postgres"], indirect=True)
async def test_start_deadlines_survive_an_ha_failover(storage_factory):
    """A job with a start deadline is accepted by the HA leader; the leader stops; the new
    leader, loaded from the shared store, expires it at its deadline and never hands it out,
    while a waiting job without a deadline still runs."""
    mesh = LocalMesh()
    replicas = []
    for name in ("a", "b"):
        app = Istos(storage=storage_factory(), transport=mesh.transport(name), node_id=name,
                    request_timeout_s=2.0)
        app.queue("q", ha=True, ha_lease_s=0.6, sweep_interval_s=0.05)
        replicas.append(app)
    a, b = replicas
    producer = Istos(transport=mesh.transport("p"), node_id="p", request_timeout_s=2.0)
    worker = Istos(transport=mesh.transport("w"), node_id="w", request_timeout_s=2.0)
    runs: list[str] = []

    @worker.worker("q", poll_interval_s=0.05)
    async def handle(job: str) -> None:
        runs.append(job)

    async def leader_is(app: Istos) -> None:
        async def loop() -> None:
            while not app.is_active_owner("q"):
                await asyncio.sleep(0.01)  # leadership is the election task's side effect
        await asyncio.wait_for(loop(), 20.0)

    await a.start()
    await leader_is(a)
    await b.start()
    try:
        async with producer.serving():
            utc = dt.timezone.utc
            await producer.enqueue("q", "short", job_id="short", expires_s=1.5)
            await producer.enqueue("q", "by", job_id="by",
                                   start_by=dt.datetime.now(utc) + dt.timedelta(seconds=1.5))
            await producer.enqueue("q", "plain", job_id="plain")
            assert a.owners["q"].state.jobs["short"].start_by is not None
            await a.stop()  # a clean stop hands the leadership over at once
            await leader_is(b)
            owner = b.owners["q"]
            assert set(owner.state.jobs) == {"short", "by", "plain"}
            for jid in ("short", "by"):
                rec = owner.state.jobs[jid]
                assert rec.start_by is not None  # the deadline came through the store
                if rec.state != EXPIRED:  # (a slow machine may have passed it already)
                    await wait_events(b, lambda ev, j=jid: count(ev, "expired", j) == 1, 20.0)
                assert (await producer.result("q", jid))["state"] == "expired"
            assert owner.state.jobs["plain"].state == READY
            async with worker.serving():
                await wait_events(b, lambda ev: count(ev, "acked", "plain") == 1, 20.0)
            assert runs == ["plain"]  # the expired jobs never ran
            assert owner.stats()["counts"][EXPIRED] == 2
    finally:
        await b.stop()
        await a.stop()
