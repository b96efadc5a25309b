"""Unique keys with a scope: ``enqueue(..., unique_key=K, unique=SCOPE, unique_s=...)``.

Pure index and state, the producer's checks, the wire schema, and real Zenoh on every storage
(memory, Redis, PostgreSQL, SQLite) across an owner restart on a new owner node."""

from __future__ import annotations

import asyncio
import time

import pytest
import test_durable
from helpers import count, wait_events
from zenoh_util import isolated_configs, unique_prefix

from istos import ConfigError, Enqueued, InvalidJob, Istos
from istos.clock import ManualClock
from istos.core.dedup import DedupMark, mark_from_dict
from istos.core.state import QueuePolicy, QueueState
from istos.core.unique import UniqueSpec
from istos.protocol import check_request
from istos.transport.local import LocalMesh

storage_factory = test_durable.storage_factory  # memory, Redis, PostgreSQL, SQLite


def _add(state: QueueState, jid: str, spec: UniqueSpec, now: float) -> bool:
    """What the owner's accept path does for one job (owner/handlers/accept.py), purely."""
    if state.unique.holder(spec.key, state.jobs, now) is not None:
        return False
    rec = spec.apply(state.new_record(jid, b"x", now))
    state.insert(rec, now)
    state.dirty.append(rec)
    return True


def _claim_ack(state: QueueState, now: float, *, ack: bool = True) -> str:
    (rec,) = state.claim(["w"], now)
    if ack:
        assert state.ack(rec.job_id, rec.lease_token, now) == "ok"
    return rec.job_id


@pytest.mark.fast
def test_pure_queued_scope_lets_a_new_job_in_once_the_first_is_claimed():
    state = QueueState("q", QueuePolicy())
    spec = UniqueSpec("feed:42", "queued")
    assert _add(state, "a", spec, 0.0)
    assert not _add(state, "b", spec, 1.0)
    assert state.unique.holder("feed:42", state.jobs, 1.0) == "a"
    _claim_ack(state, 2.0, ack=False)  # leased: the key is free for a refresh
    assert _add(state, "b", spec, 3.0)
    assert not _add(state, "c", spec, 3.0)


@pytest.mark.fast
def test_pure_active_scope_holds_until_acked_and_a_retry_keeps_it():
    state = QueueState("q", QueuePolicy(max_attempts=1))
    spec = UniqueSpec("k", "active")
    assert _add(state, "a", spec, 0.0)
    _claim_ack(state, 1.0, ack=False)
    assert not _add(state, "b", spec, 2.0)
    rec = state.jobs["a"]
    assert state.ack("a", rec.lease_token, 3.0) == "ok"
    assert "a" not in state.jobs and len(state.unique) == 0  # no window: nothing kept
    assert _add(state, "b", spec, 4.0)


@pytest.mark.fast
def test_pure_finished_scope_holds_for_its_window_through_a_mark():
    state = QueueState("q", QueuePolicy())
    spec = UniqueSpec("k", "finished", 10.0)
    assert _add(state, "a", spec, 0.0)
    _claim_ack(state, 1.0)
    dirty, _ = state.drain()
    mark = DedupMark("a", 11.0, "k")
    assert mark in dirty  # the key rides on the mark written in place of the record
    assert mark_from_dict("a", mark.to_dict()) == mark
    assert not _add(state, "b", spec, 10.9)
    assert state.unique.holder("k", state.jobs, 10.9) == "a"
    state.sweep(11.0)
    assert state.drain()[0] == ["a"] and len(state.unique) == 0
    assert _add(state, "b", spec, 11.0)


@pytest.mark.fast
def test_pure_restore_rebuilds_the_index_from_records_and_marks():
    state = QueueState("q", QueuePolicy())
    _add(state, "a", UniqueSpec("k1"), 0.0)
    _add(state, "b", UniqueSpec("k2", "finished", 50.0), 0.0)
    _claim_ack(state, 1.0, ack=False)  # a: leased
    (b,) = state.claim(["w"], 1.0)
    state.ack("b", b.lease_token, 2.0)
    dirty, _ = state.drain()
    mark = next(c for c in dirty if isinstance(c, DedupMark))
    again = QueueState("q", QueuePolicy())
    again.restore(state.jobs["a"], 5.0)
    again.restore_mark(mark)
    assert again.unique.holder("k1", again.jobs, 5.0) == "a"
    assert again.unique.holder("k2", again.jobs, 5.0) == "b"
    assert again.unique.holder("k2", again.jobs, 52.0) is None


@pytest.mark.fast
def test_wire_schema_refuses_bad_unique_fields_naming_them():
    base = {"v": 1, "op": "enqueue", "body": b"x", "job_id": "a"}
    check_request({**base, "unique": {"key": "k", "scope": "finished", "s": 5.0}}, bool)
    for bad, field in (({"key": ""}, "unique.key"), ({"key": "k", "scope": "later"},
                       "unique.scope"), ({"key": "k", "scope": "finished", "s": -1},
                       "unique.s"), ({"key": "k", "s": 5.0}, "unique.s"), ("k", "unique"),
                       ({"key": "k" * 201}, "unique.key")):
        with pytest.raises(InvalidJob, match=field.replace(".", r"\.")):
            check_request({**base, "unique": bad}, bool)
    many = {"v": 1, "op": "enqueue_many", "items": [{"body": b"x", "job_id": "a",
                                                      "unique": {"key": 3}}]}
    with pytest.raises(InvalidJob, match=r"items\[0\]\.unique\.key"):
        check_request(many, bool)


def test_producer_checks_unique_options_before_sending():
    app = Istos(transport=LocalMesh().transport("p"))
    for kw, field in (({"unique_key": ""}, "unique_key"),
                      ({"unique_key": "k", "unique": "soon"}, "unique must"),
                      ({"unique_key": "k", "unique": "finished", "unique_s": -1}, "unique_s"),
                      ({"unique_key": "k", "unique": "finished", "unique_s": float("inf")},
                       "unique_s"),
                      ({"unique_key": "k", "unique_s": 5}, "unique_s needs"),
                      ({"unique": "queued"}, "need a unique_key")):
        with pytest.raises(ConfigError, match=field):
            asyncio.run(app.enqueue("q", 1, **kw))
    with pytest.raises(ConfigError, match="unique_keys has 1 entries for 2 items"):
        asyncio.run(app.enqueue_many("q", [1, 2], unique_keys=["k"]))
    with pytest.raises(ConfigError, match="item 1: unique_key"):
        asyncio.run(app.enqueue_many("q", [1, 2], unique_keys=["k", ""]))


async def test_unique_keys_over_zenoh_on_every_storage_across_a_restart(storage_factory):
    configs, prefix = isolated_configs(3), unique_prefix()
    # The first owner's clock moves only when the test says (from now, so the second owner
    # reads its stored deadlines on the same timeline): on the loop's clock a loaded machine
    # could end the 0.3 s delay, and lease the job, before the duplicate meant to find it queued.
    clock = ManualClock(time.time())
    first = Istos(storage=storage_factory(), zenoh=configs[0], prefix=prefix, node_id="o1",
                  clock=clock)
    first.queue("q", keep_results=False)
    producer = Istos(zenoh=configs[1], prefix=prefix, node_id="p")
    release = asyncio.Event()
    runs: list[int] = []

    @producer.worker("q", concurrency=4, poll_interval_s=0.1)
    async def handle(job):
        runs.append(job)
        if job >= 100:  # the long runs hold their key while leased
            await release.wait()

    async with producer.serving():
        async with first.serving():
            # queued: a second enqueue while the first waits resolves to the first
            a = await producer.enqueue("q", 100, unique_key="feed", unique="queued",
                                       delay_s=0.3)
            assert isinstance(a, Enqueued) and a.created and a.reason is None
            dup = await producer.enqueue("q", 101, unique_key="feed", unique="queued")
            assert dup == a and not dup.created and dup.reason == "unique_key"
            clock.advance(0.3)  # the delay ends: the job is leased
            await wait_events(first, lambda ev: count(ev, "claimed", a) == 1, 20.0)
            refresh = await producer.enqueue("q", 102, unique_key="feed", unique="queued")
            assert refresh != a and refresh.created  # leased: a refresh may queue
            # active: held while leased, across a restart of the owner
            act = await producer.enqueue("q", 103, unique_key="sync", unique="active")
            await wait_events(first, lambda ev: count(ev, "claimed", act) == 1, 20.0)
            again = await producer.enqueue("q", 104, unique_key="sync")
            assert again == act and again.reason == "unique_key"
            # finished: held for unique_s after the ack; enqueue_many resolves per item
            ids = await producer.enqueue_many("q", [1, 2, 3], unique_keys=["r", "r", None],
                                              unique="finished", unique_s=600)
            assert ids[0] == ids[1] != ids[2]
            await wait_events(first, lambda ev: count(ev, "acked", ids[0]) == 1, 20.0)
            held = await producer.enqueue("q", 4, unique_key="r", unique="finished",
                                          unique_s=600)
            assert held == ids[0] and not held.created
            with pytest.raises(InvalidJob, match="unique_key"):  # an id meaning another job
                await producer.enqueue("q", 5, job_id=act, unique_key="other")
        durable = first.node.storage.durable
        if durable:
            second = Istos(storage=storage_factory(), zenoh=configs[2], prefix=prefix,
                           node_id="o2")
            second.queue("q", keep_results=False)
            async with second.serving():
                assert await producer.enqueue("q", 6, unique_key="r", unique="finished",
                                              unique_s=600) == ids[0]
                leased = await producer.enqueue("q", 105, unique_key="sync")
                assert leased == act and not leased.created  # still leased after reload
                release.set()
                events = await wait_events(
                    second, lambda ev: count(ev, "acked", act) == 1, 30.0)
                free = await producer.enqueue("q", 7, unique_key="sync")
                assert free.created and free != act
                assert count(events, "duplicate_enqueue") >= 2
        release.set()
    assert 101 not in runs and 4 not in runs and 6 not in runs


async def test_concurrent_enqueues_of_one_key_create_one_job(storage_factory):
    """The key's first write is in flight while the others arrive: they wait for it."""
    mesh = LocalMesh()
    owner = Istos(storage=storage_factory(), transport=mesh.transport("o"))
    owner.queue("q")
    async with owner.serving():
        got = await asyncio.gather(*(owner.enqueue("q", i, unique_key="k") for i in range(20)))
        assert len(set(got)) == 1 and sum(g.created for g in got) == 1
        assert owner.owners["q"].state.counts["ready"] == 1


async def test_unique_keys_debounce_and_edits_survive_an_ha_failover():
    from istos import MemoryStorage

    mesh, storage = LocalMesh(), MemoryStorage(durable=True, shared=True)
    replicas = []
    for name in ("a", "b"):
        app = Istos(storage=storage, transport=mesh.transport(name), node_id=name,
                    request_timeout_s=1.0)
        app.queue("q", ha=True, ha_lease_s=0.6, sweep_interval_s=0.05)
        replicas.append(app)
    a, b = replicas
    producer = Istos(transport=mesh.transport("p"), request_timeout_s=1.0)

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
            held = await producer.enqueue("q", 1, unique_key="k", delay_s=3600)
            burst = await producer.enqueue("q", 2, debounce_key="d", debounce_s=3600)
            assert await producer.update("q", held, priority=7) == "updated"
            await a.stop()  # a clean stop hands the leadership over at once
            await leader_is(b)
            again = await producer.enqueue("q", 3, unique_key="k")
            assert again == held and again.reason == "unique_key"
            joined = await producer.enqueue("q", 4, debounce_key="d", debounce_s=3600)
            assert joined == burst and joined.reason == "debounce_key"
            rec = b.owners["q"].state.jobs[held]
            assert rec.priority == 7 and rec.edits == 1
            assert b.owners["q"].state.jobs[burst].edits == 1
    finally:
        await b.stop()
        await a.stop()


async def test_sync_producer_takes_the_same_options_from_a_thread():
    from istos import SyncProducer

    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    async with owner.serving():
        with SyncProducer(configs[1], prefix=prefix, request_timeout_s=20) as sp:
            def produce() -> tuple[str, str, list[str], str, str, str]:
                a = sp.enqueue("q", 1, unique_key="k", delay_s=60)
                b = sp.enqueue("q", 2, unique_key="k")
                many = sp.enqueue_many("q", [3, 4], unique_keys=["k", "m"])
                burst = sp.enqueue("q", 5, debounce_key="d", debounce_s=60)
                joined = sp.enqueue("q", 6, debounce_key="d", debounce_s=60)
                return a, b, many, burst, joined, sp.update("q", a, priority=3)

            a, b, many, burst, joined, status = await asyncio.to_thread(produce)
    assert a == b == many[0] and many[1] != a and burst == joined and status == "updated"
    assert isinstance(b, Enqueued) and b.reason == "unique_key"
    assert joined.reason == "debounce_key"


async def test_operators_see_a_jobs_unique_key_and_burst_in_the_jobs_listing():
    """The ``jobs`` read op (what ``istos jobs``, LiveQueue and the dashboard list) names a
    job's unique key and scope, and its debounce burst's key; a job without either shows none."""
    app = Istos(transport=LocalMesh().transport("o"))
    app.queue("q")
    async with app.serving():
        keyed = await app.enqueue("q", 1, unique_key="feed:42", unique="queued")
        burst = await app.enqueue("q", 2, debounce_key="reindex:7", debounce_s=60.0)
        plain = await app.enqueue("q", 3)
        rows = {j["job_id"]: j for j in (await app.client("q").call("jobs"))["jobs"]}
    assert (rows[keyed]["unique_key"], rows[keyed]["unique"]) == ("feed:42", "queued")
    assert rows[burst]["debounce_key"] == "reindex:7" and "unique_key" not in rows[burst]
    assert "unique_key" not in rows[plain] and "debounce_key" not in rows[plain]
