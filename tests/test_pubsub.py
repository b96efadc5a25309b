"""Pub/sub (fan-out, durable catch-up, bounded history) and the idempotency ledger.

Most tests run on the in-process mesh; the ledger's atomicity is also checked on Redis and
PostgreSQL (skipped locally when absent, failed in CI: see ``services.py``), and fan-out once over
real Zenoh sessions.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from helpers import app_on, count, wait_events
from services import drop_postgres_table, postgres_url, redis_url

from istos import ConfigError, Istos, IstosError, JobContext, MemoryStorage
from istos.clock import ManualClock
from istos.features.pubsub import CURSOR_NS, EventMeta
from istos.node import run_inline
from istos.transport.local import LocalMesh

BOUND_S = 5.0




class Inbox:
    """Collects what a subscriber received and lets a test await a count, with a bound.

    ``add`` may be called from a worker thread (plain-function subscribers): it then hands the
    item to the loop, because an asyncio.Event must only be set on its loop.
    """

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._changed = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()

    def add(self, item: Any) -> None:
        if threading.get_ident() == self._loop_thread:
            self._append(item)
        else:
            self._loop.call_soon_threadsafe(self._append, item)

    def _append(self, item: Any) -> None:
        self.items.append(item)
        self._changed.set()

    async def until(self, pred: Callable[[list[Any]], bool], timeout_s: float = BOUND_S) -> None:
        async def wait() -> None:
            while not pred(self.items):
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(wait(), timeout_s)

    async def reach(self, n: int) -> list[Any]:
        await self.until(lambda items: len(items) >= n)
        return self.items


# -- fan-out --------------------------------------------------------------------------------------


async def test_fan_out_to_three_apps_in_order(mesh):
    pub = app_on(mesh, "pub")
    subs = [app_on(mesh, f"sub{i}") for i in range(3)]
    inboxes = [Inbox() for _ in subs]
    for app, inbox in zip(subs, inboxes):
        @app.subscribe("orders/created")
        async def on_order(data, meta: EventMeta, inbox=inbox):
            inbox.add((data["i"], meta))

    async with pub.serving(), subs[0].serving(), subs[1].serving(), subs[2].serving():
        for i in range(50):
            assert await pub.publish("orders/created", {"i": i}) is None
        for inbox in inboxes:
            await inbox.reach(50)
    for inbox in inboxes:
        assert [i for i, _ in inbox.items] == list(range(50))
        meta = inbox.items[0][1]
        assert meta.key == "orders/created" and meta.seq is None
        assert isinstance(meta.published_at, float)


async def test_publisher_own_subscriber_and_other_keys(mesh):
    app = app_on(mesh, "solo")
    mine, other = Inbox(), Inbox()
    app.subscribe("a")(mine.add)
    app.subscribe("b")(other.add)
    async with app.serving():
        await app.publish("a", 1)
        await app.publish("a", 2)
        await mine.reach(2)
    assert mine.items == [1, 2] and other.items == []


async def test_plain_function_runs_in_a_thread(mesh):
    pub, sub = app_on(mesh, "pub"), app_on(mesh, "sub")
    inbox = Inbox()
    loop_thread = threading.get_ident()

    @sub.subscribe("k")
    def handle(data):  # a plain function: the loop must not run it
        inbox.add((data, threading.get_ident()))

    async with pub.serving(), sub.serving():
        for i in range(3):
            await pub.publish("k", i)
        await inbox.reach(3)
    assert [d for d, _ in inbox.items] == [0, 1, 2]
    assert all(t != loop_thread for _, t in inbox.items)


async def test_plain_function_inline_when_run_inline(mesh):
    pub, sub = app_on(mesh, "pub"), app_on(mesh, "sub", run_sync=run_inline)
    inbox = Inbox()

    @sub.subscribe("k")
    def handle(data):
        inbox.add((data, threading.get_ident()))

    async with pub.serving(), sub.serving():
        await pub.publish("k", "x")
        await inbox.reach(1)
    assert inbox.items == [("x", threading.get_ident())]


async def test_subscriber_exception_is_logged_and_later_events_arrive(mesh, caplog):
    pub, sub = app_on(mesh, "pub"), app_on(mesh, "sub")
    inbox = Inbox()

    @sub.subscribe("k")
    async def flaky(data):
        inbox.add(data)
        if data == 2:
            raise RuntimeError("boom on 2")

    with caplog.at_level(logging.ERROR, logger="istos.features.pubsub"):
        async with pub.serving(), sub.serving():
            for i in range(5):
                await pub.publish("k", i)
            await inbox.reach(5)
    assert inbox.items == [0, 1, 2, 3, 4]
    assert any("boom on 2" in (r.exc_text or "") for r in caplog.records)


async def test_declaration_and_publish_errors(mesh):
    app = app_on(mesh, "a")
    with pytest.raises(ConfigError, match="event key"):
        app.subscribe("orders/*")
    with pytest.raises(ConfigError, match="poll_interval_s"):
        app.subscribe("k", durable=True, poll_interval_s=0)
    with pytest.raises(IstosError, match="not serving"):
        await app.publish("k", 1)

    @app.subscribe("k", durable=True, name="n")
    async def one(data):
        pass

    with pytest.raises(ConfigError, match="twice"):
        app.subscribe("k", durable=True, name="n")(one)
    async with app.serving():
        with pytest.raises(ConfigError, match="before serving"):
            app.subscribe("k")(one)
        with pytest.raises(ValueError, match="cannot be encoded"):
            await app.publish("k", object())
        with pytest.raises(ConfigError, match="history_limit"):
            await app.publish("k", 1, durable=True, history_limit=0)


# -- durable events -------------------------------------------------------------------------------


async def test_durable_subscriber_catches_up_after_restart_plain_one_misses(mesh):
    shared = MemoryStorage(durable=True, shared=True)
    pub = app_on(mesh, "pub", storage=shared)
    sub = app_on(mesh, "sub", storage=shared)
    durable_in, plain_in = Inbox(), Inbox()

    @sub.subscribe("audit", durable=True, name="auditor")
    async def audit(data, meta):
        durable_in.add((data, meta.seq))

    @sub.subscribe("audit")
    async def watch(data):
        plain_in.add(data)

    async with pub.serving():
        async with sub.serving():
            seqs = [await pub.publish("audit", i, durable=True) for i in range(5)]
            await durable_in.reach(5)
            await plain_in.reach(5)
        assert seqs == [1, 2, 3, 4, 5]
        for i in range(5, 15):  # the subscriber app is down
            await pub.publish("audit", i, durable=True)
        assert await shared.get(CURSOR_NS, "audit|auditor") == b"5"
        async with sub.serving():
            await durable_in.reach(15)  # caught up from the history, without a new event
            await pub.publish("audit", 15, durable=True)
            await durable_in.reach(16)
            await plain_in.reach(6)
    assert durable_in.items == [(i, i + 1) for i in range(16)]
    assert plain_in.items == [0, 1, 2, 3, 4, 15]


async def test_late_joiner_replays_history_and_duplicates_are_dropped(mesh):
    shared = MemoryStorage(durable=True, shared=True)
    pub, late = app_on(mesh, "pub", storage=shared), app_on(mesh, "late", storage=shared)
    inbox = Inbox()

    @late.subscribe("k", durable=True)
    async def replay(data, meta):
        inbox.add(meta.seq)

    async with pub.serving():
        for i in range(4):
            await pub.publish("k", i, durable=True)
        async with late.serving():
            for i in range(4, 8):  # live events racing the catch-up: each delivered once
                await pub.publish("k", i, durable=True)
            await inbox.reach(8)
            await pub.publish("k", 8, durable=True)
            await inbox.reach(9)
    assert inbox.items == list(range(1, 10))


async def test_gap_in_live_sequence_is_filled_from_history(mesh):
    shared = MemoryStorage(durable=True, shared=True)
    pub, sub = app_on(mesh, "pub", storage=shared), app_on(mesh, "sub", storage=shared)
    inbox = Inbox()

    @sub.subscribe("k", durable=True, name="gapless", poll_interval_s=60)
    async def on_event(data, meta):
        inbox.add((data, meta.seq))

    async with pub.serving(), sub.serving():
        await pub.publish("k", "a", durable=True)
        await inbox.reach(1)
        # Seq 2 reaches the history but its live message is lost (sent to nobody).
        real_put = pub.node.transport.put

        async def lose(key, payload):
            return None

        pub.node.transport.put = lose
        await pub.publish("k", "b", durable=True)
        pub.node.transport.put = real_put
        await pub.publish("k", "c", durable=True)
        await inbox.reach(3)
    assert inbox.items == [("a", 1), ("b", 2), ("c", 3)]


async def test_poll_finds_a_lost_last_event(mesh):
    shared = MemoryStorage(durable=True, shared=True)
    pub, sub = app_on(mesh, "pub", storage=shared), app_on(mesh, "sub", storage=shared)
    inbox = Inbox()
    sub.subscribe("k", durable=True, name="poller", poll_interval_s=0.05)(inbox.add)

    async def lose(key, payload):
        return None

    async with pub.serving(), sub.serving():
        pub.node.transport.put = lose
        await pub.publish("k", "only in the history", durable=True)
        await inbox.reach(1)
    assert inbox.items == ["only in the history"]


async def test_history_bounded_by_count(mesh):
    shared = MemoryStorage(durable=True, shared=True)
    pub, late = app_on(mesh, "pub", storage=shared), app_on(mesh, "late", storage=shared)
    inbox = Inbox()
    late.subscribe("k", durable=True, name="late")(lambda data, meta: inbox.add(meta.seq))
    async with pub.serving():
        for i in range(12):
            await pub.publish("k", i, durable=True, history_limit=5)
        stored = sorted(int(k) for k, _ in await shared.scan("events:k"))
        assert stored == [8, 9, 10, 11, 12]
        async with late.serving():
            await inbox.reach(5)
            await pub.publish("k", 12, durable=True, history_limit=5)
            await inbox.reach(6)
    assert inbox.items == [8, 9, 10, 11, 12, 13]


async def test_history_bounded_by_age(mesh):
    clock = ManualClock()
    shared = MemoryStorage(durable=True, shared=True)
    pub = app_on(mesh, "pub", storage=shared, clock=clock)
    late = app_on(mesh, "late", storage=shared, clock=clock)
    inbox = Inbox()
    late.subscribe("k", durable=True, name="late")(lambda data, meta: inbox.add(meta.seq))
    async with pub.serving():
        for i in range(40):
            await pub.publish("k", i, durable=True, history_ttl_s=10)
        clock.t += 11  # all 40 are now too old
        for i in range(40, 50):
            await pub.publish("k", i, durable=True, history_ttl_s=10)
        stored = sorted(int(k) for k, _ in await shared.scan("events:k"))
        # Each publish deleted up to two of the oldest expired entries, sparing the newest 32.
        assert stored == list(range(18, 51))
        async with late.serving():
            await inbox.reach(10)
            await pub.publish("k", 50, durable=True, history_ttl_s=10)
            await inbox.reach(11)
    assert inbox.items == list(range(41, 52))  # the expired ones were not replayed


async def test_sequence_numbers_unique_across_racing_publishers(mesh):
    shared = MemoryStorage(durable=True, shared=True)
    pubs = [app_on(mesh, f"p{i}", storage=shared) for i in range(3)]
    sub = app_on(mesh, "sub", storage=shared)
    inbox = Inbox()
    sub.subscribe("k", durable=True, name="all")(lambda data, meta: inbox.add((data, meta.seq)))
    async with pubs[0].serving(), pubs[1].serving(), pubs[2].serving(), sub.serving():
        seqs = await asyncio.gather(*(p.publish("k", f"{n}-{i}", durable=True)
                                      for i in range(20) for n, p in enumerate(pubs)))
        await inbox.reach(60)
    assert sorted(seqs) == list(range(1, 61))
    assert [s for _, s in inbox.items] == list(range(1, 61))
    for n in range(3):  # each publisher's events arrive in the order it published them
        mine = [d for d, _ in inbox.items if d.startswith(f"{n}-")]
        assert mine == [f"{n}-{i}" for i in range(20)]


async def test_idle_publisher_behind_the_trimmed_history_does_not_reuse_numbers(mesh):
    shared = MemoryStorage(durable=True, shared=True)
    idle, busy = app_on(mesh, "idle", storage=shared), app_on(mesh, "busy", storage=shared)
    async with idle.serving(), busy.serving():
        assert await idle.publish("k", "first", durable=True, history_limit=3) == 1
        for i in range(10):  # trims number 1..8 while `idle` still believes 1 is the newest
            await busy.publish("k", i, durable=True, history_limit=3)
        assert await idle.publish("k", "again", durable=True, history_limit=3) == 12
    stored = sorted(int(k) for k, _ in await shared.scan("events:k"))
    assert stored == [10, 11, 12]


async def test_corrupt_history_entry_is_skipped_not_fatal(mesh):
    shared = MemoryStorage(durable=True, shared=True)
    pub, late = app_on(mesh, "pub", storage=shared), app_on(mesh, "late", storage=shared)
    inbox = Inbox()
    late.subscribe("k", durable=True, name="late")(lambda data, meta: inbox.add(meta.seq))
    async with pub.serving():
        for i in range(3):
            await pub.publish("k", i, durable=True)
        await shared.put("events:k", f"{2:020d}", b"not msgpack \xc1")
        async with late.serving():
            await inbox.reach(2)
            assert await pub.publish("k", 3, durable=True) == 4
            await inbox.reach(3)
    assert inbox.items == [1, 3, 4]


# -- the idempotency ledger -----------------------------------------------------------------------


async def test_ledger_first_once_then_false(mesh):
    app = app_on(mesh, "a")
    async with app.serving():
        async with app.idempotent("charge:42") as first:
            assert first is True
            assert await app.ledger_status("charge:42") == "in_progress"
        assert await app.ledger_status("charge:42") == "done"
        for _ in range(3):
            async with app.idempotent("charge:42") as first:
                assert first is False
        async with app.idempotent("charge:43") as first:
            assert first is True


async def test_ledger_raising_body_releases_the_key(mesh):
    app = app_on(mesh, "a")
    async with app.serving():
        with pytest.raises(RuntimeError, match="card declined"):
            async with app.idempotent("charge:1") as first:
                assert first
                raise RuntimeError("card declined")
        assert await app.ledger_status("charge:1") is None
        async with app.idempotent("charge:1") as first:
            assert first is True
        async with app.idempotent("charge:1") as first:
            assert first is False


async def test_ledger_ttl_and_in_progress_expiry():
    clock = ManualClock()
    app = Istos(transport=LocalMesh().transport("a"), clock=clock)
    async with app.serving():
        async with app.idempotent("k", ttl_s=60) as first:
            assert first
        clock.t += 59
        async with app.idempotent("k", ttl_s=60) as first:
            assert not first
        clock.t += 2  # the done record has expired
        async with app.idempotent("k", ttl_s=60) as first:
            assert first
        # A holder that crashes mid-block (never exits) holds the key for in_progress_ttl_s.
        crashed = app.idempotent("crash", in_progress_ttl_s=30)
        assert await crashed.__aenter__() is True
        async with app.idempotent("crash") as first:
            assert not first
        clock.t += 31
        second = app.idempotent("crash")
        assert await second.__aenter__() is True
        # The first holder comes back and fails: it must not release the second one's claim.
        assert await crashed.__aexit__(ValueError, ValueError("late"), None) is False
        assert await app.ledger_status("crash") == "in_progress"
        async with app.idempotent("crash") as first:
            assert not first
        await second.__aexit__(None, None, None)
        assert await app.ledger_status("crash") == "done"
        clock.t += 100  # done|k (ttl 60) has expired, done|crash (ttl one day) has not
        assert await app.ledger_purge() == 1
        assert await app.ledger_status("k") is None
        assert await app.ledger_status("crash") == "done"


async def test_ledger_rejects_bad_options(mesh):
    app = app_on(mesh, "a")
    async with app.serving():
        with pytest.raises(ConfigError, match="ttl_s"):
            app.idempotent("k", ttl_s=0)
        with pytest.raises(ConfigError, match="idempotency key"):
            app.idempotent("")


async def _race(apps: list[Istos], key: str, per_app: int) -> int:
    """Run ``per_app`` concurrent claims of ``key`` on each app; how many were first."""
    firsts: list[bool] = []

    async def attempt(app: Istos) -> None:
        async with app.idempotent(key) as first:
            firsts.append(first)
            await asyncio.sleep(0.01)  # stay inside so the others race a live claim

    await asyncio.wait_for(asyncio.gather(*(attempt(a) for a in apps for _ in range(per_app))),
                           BOUND_S)
    assert len(firsts) == len(apps) * per_app
    return sum(firsts)


async def test_ledger_twenty_concurrent_claims_admit_one_memory(mesh):
    app = app_on(mesh, "a")
    async with app.serving():
        assert await _race([app], "charge:7", 20) == 1


@pytest.mark.redis
async def test_ledger_twenty_concurrent_claims_admit_one_redis(mesh):
    from istos.storage.redis import RedisStoragePlugin

    url, prefix = redis_url(), f"istos-test-{uuid.uuid4().hex}"
    apps = [app_on(mesh, f"r{i}", storage=RedisStoragePlugin(url, key_prefix=prefix))
            for i in range(4)]
    try:
        async with apps[0].serving(), apps[1].serving(), apps[2].serving(), apps[3].serving():
            assert await _race(apps, "charge:7", 5) == 1
            assert await apps[3].ledger_status("charge:7") == "done"
    finally:
        cleaner = RedisStoragePlugin(url, key_prefix=prefix)
        await cleaner.wipe()
        await cleaner.close()


@pytest.mark.postgres
async def test_ledger_twenty_concurrent_claims_admit_one_postgres(mesh):
    from istos.storage.sqlalchemy import SQLAlchemyStoragePlugin

    url, table = postgres_url(), f"istos_kv_pubsub_{uuid.uuid4().hex[:12]}"
    apps = [app_on(mesh, f"p{i}", storage=SQLAlchemyStoragePlugin(url, table=table))
            for i in range(4)]
    try:
        async with apps[0].serving(), apps[1].serving(), apps[2].serving(), apps[3].serving():
            assert await _race(apps, "charge:7", 5) == 1
            assert await apps[3].ledger_status("charge:7") == "done"
    finally:
        await drop_postgres_table(url, table)


async def test_redelivered_job_skips_the_side_effect(mesh):
    owner, worker = app_on(mesh, "owner"), app_on(mesh, "worker")
    owner.queue("jobs/charge", max_attempts=3, retry_backoff_s=0.0, retry_jitter=0.0)
    charged: list[int] = []
    attempts: list[int] = []

    @worker.worker("jobs/charge", poll_interval_s=0.05)
    async def charge(job, ctx: JobContext):
        attempts.append(ctx.attempt)
        async with worker.idempotent(f"charge:{job['order']}") as first:
            if first:
                charged.append(job["order"])
        if ctx.attempt == 1:
            raise RuntimeError("crashed after charging, before the ack")

    async with owner.serving(), worker.serving():
        jid = await owner.enqueue("jobs/charge", {"order": 42})
        await wait_events(owner, lambda ev: count(ev, "acked", jid) == 1)
    assert attempts == [1, 2]
    assert charged == [42]


# -- real Zenoh -----------------------------------------------------------------------------------


async def test_fan_out_over_real_zenoh():
    from zenoh_util import isolated_configs, unique_prefix, wait_until

    prefix = unique_prefix()
    apps = [Istos(zenoh=cfg, prefix=prefix) for cfg in isolated_configs(2)]
    inboxes = [Inbox(), Inbox()]
    for app, inbox in zip(apps, inboxes):
        app.subscribe("ticks")(inbox.add)
    async with apps[0].serving(), apps[1].serving():
        # Subscriptions propagate asynchronously: warm up until both see the publisher.
        async def both_warm() -> bool:
            await apps[0].publish("ticks", "warm")
            return all(inbox.items for inbox in inboxes)

        await wait_until(both_warm, what="subscriptions routed")
        for i in range(30):
            await apps[0].publish("ticks", i)
        for inbox in inboxes:
            await inbox.until(lambda items: items[-1:] == [29])
    for inbox in inboxes:
        assert [x for x in inbox.items if x != "warm"] == list(range(30))
