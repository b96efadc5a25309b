"""Chains, groups and chords on the in-process mesh: piping, retries, dead steps, barriers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import app_on, count, extend_owners, wait_events

from istos import (
    ConfigError,
    Istos,
    IstosError,
    JobContext,
    MemoryStorage,
    OwnerUnavailable,
    codec,
)
from istos.clock import ManualClock
from istos.features.workflow import Barrier
from istos.owner.extension import Hooks, OwnerExtension
from istos.transport.local import LocalMesh

pytestmark = pytest.mark.fast  # `make check`: no process, server or session


async def wait_for(event: asyncio.Event, timeout_s: float = 5.0) -> None:
    await asyncio.wait_for(event.wait(), timeout_s)


# -- chain --

async def test_chain_pipes_each_result_into_the_next_step(mesh):
    owner, worker = app_on(mesh, "owner"), app_on(mesh, "worker")
    for q in ("fetch", "parse", "store"):
        owner.queue(q)
    stored: list = []
    done = asyncio.Event()

    @worker.worker("fetch")
    async def fetch(url):
        return {"page": f"<{url}>"}

    @worker.worker("parse")
    async def parse(doc):
        return {"words": len(doc["page"]), "page": doc["page"]}

    @worker.worker("store")
    async def store(parsed):
        stored.append(parsed)
        done.set()

    async with owner.serving(), worker.serving():
        first = await owner.chain(["fetch", "parse", "store"], "http://x")
        await wait_for(done)
        events = await wait_events(owner, lambda ev: count(ev, "acked") == 3)
    chain_id = first.rsplit(".", 1)[0]
    assert first == f"{chain_id}.0"
    assert stored == [{"words": 10, "page": "<http://x>"}]
    acked = [(e.queue, e.job_id) for e in events if e.kind == "acked"]
    assert acked == [("fetch", f"{chain_id}.0"), ("parse", f"{chain_id}.1"),
                     ("store", f"{chain_id}.2")]


async def test_chain_step_failing_once_is_retried_and_chain_completes_once(mesh):
    app = app_on(mesh, "solo")
    app.queue("a")
    app.queue("b", retry_backoff_s=0.01, retry_jitter=0.0)
    app.queue("c")
    finals: list = []
    tries: list[int] = []

    @app.worker("a")
    async def step_a(n):
        return n + 1

    @app.worker("b")
    async def step_b(n, ctx: JobContext):
        tries.append(ctx.attempt)
        if ctx.attempt == 1:
            raise RuntimeError("flaky")
        return n * 10

    @app.worker("c")
    async def step_c(n):
        finals.append(n)

    async with app.serving():
        await app.chain(["a", "b", "c"], 1, priority=3)
        events = await wait_events(app, lambda ev: count(ev, "acked") == 3)
    assert tries == [1, 2] and finals == [20]
    assert sum(1 for e in events if e.queue == "c" and e.kind == "enqueued") == 1
    # continuations keep the chain's priority
    assert [e.detail["priority"] for e in events if e.kind == "enqueued"] == [3, 3, 3]


async def test_dead_chain_step_ends_the_chain_and_its_dead_letter_names_it(mesh):
    app = app_on(mesh, "solo")
    app.queue("a")
    app.queue("b", max_attempts=2, retry_backoff_s=0.01)
    app.queue("c")
    reached_c = []

    @app.worker("a")
    async def step_a(n):
        return {"n": n}

    @app.worker("b")
    async def step_b(doc):
        raise ValueError("poison")

    @app.worker("c")
    async def step_c(doc):
        reached_c.append(doc)

    async with app.serving():
        first = await app.chain(["a", "b", "c"], 5)
        chain_id = first.rsplit(".", 1)[0]
        await wait_events(app, lambda ev: count(ev, "dead_lettered", f"{chain_id}.1") == 1)
        (dead,) = await app.dead_letters("b")
        assert app.owners["c"].state.jobs == {}
    assert reached_c == []
    assert dead["job_id"] == f"{chain_id}.1" and dead["data"] == {"n": 5}
    assert dead["workflow"]["chain"]["id"] == chain_id
    assert dead["workflow"]["chain"]["step"] == 1
    assert dead["workflow"]["chain"]["queues"] == ["a", "b", "c"]


async def test_redelivered_step_does_not_duplicate_its_continuation(mesh):
    """A step that enqueued its continuation but never acked is redelivered; the re-enqueue of
    the continuation (same deterministic id) is dropped while the next step is held.

    Leases run on a clock the test moves: on the loop's clock a loaded machine could let the
    redelivered attempt outlive its 0.2 s lease too (a third run), or end the first attempt's
    lease before it ever enqueued its continuation."""
    clock = ManualClock()
    owner = app_on(mesh, "owner", clock=clock)
    owner.queue("a", lease_s=0.2, sweep_interval_s=0.02)
    owner.queue("b")
    worker = app_on(mesh, "worker", clock=clock, shutdown_grace_s=0.01)
    hung = asyncio.Event()
    never = asyncio.Event()
    runs: list[int] = []

    @worker.worker("a", concurrency=2, poll_interval_s=0.05)
    async def step_a(n, ctx: JobContext):
        runs.append(ctx.attempt)
        return n + 1

    original = worker._continue_hook

    async def crash_after_continuation(meta, result):
        await original(meta, result)
        if not hung.is_set():
            hung.set()
            await never.wait()  # "crash" between the continuation and the ack

    worker._continue_hook = crash_after_continuation  # type: ignore[method-assign]
    async with owner.serving(), worker.serving():
        first = await owner.chain(["a", "b"], 1)
        chain_id = first.rsplit(".", 1)[0]
        await wait_for(hung)  # the continuation is enqueued; the step never acks
        assert count(owner.events.recent(), "lease_expired", first) == 0
        clock.advance(0.2)  # the lease ends exactly now: the sweeper takes the step back
        events = await wait_events(owner, lambda ev: count(ev, "acked", first) == 1)
        b_jobs = owner.owners["b"].state.jobs
        assert list(b_jobs) == [f"{chain_id}.1"]
        assert codec.decode_body(b_jobs[f"{chain_id}.1"].body) == 2
    assert runs == [1, 2]
    assert count(events, "lease_expired", first) == 1
    assert count(events, "duplicate_enqueue", f"{chain_id}.1") == 1


async def test_chain_rejects_an_empty_list(mesh):
    app = app_on(mesh, "solo")
    async with app.serving():
        with pytest.raises(ConfigError, match="non-empty list"):
            await app.chain([], 1)
        with pytest.raises(ConfigError):
            await app.chain(["ok", "bad*"], 1)


# -- group --

async def test_group_fans_out_and_returns_ids_in_order(mesh):
    owner, worker = app_on(mesh, "owner"), app_on(mesh, "worker")
    owner.queue("thumb")
    seen: dict[str, str] = {}

    @worker.worker("thumb", concurrency=4)
    async def thumb(img, ctx: JobContext):
        seen[ctx.job_id] = img

    async with owner.serving(), worker.serving():
        ids = await owner.group("thumb", ["i1", "i2", "i3", "i4"])
        await wait_events(owner, lambda ev: count(ev, "acked") == 4)
    assert len(set(ids)) == 4
    assert [seen[i] for i in ids] == ["i1", "i2", "i3", "i4"]


async def test_group_with_an_unencodable_item_sends_nothing(mesh):
    app = app_on(mesh, "solo")
    app.queue("q")
    async with app.serving():
        with pytest.raises(ValueError, match="cannot be encoded"):
            await app.group("q", [1, object()])
        assert app.owners["q"].state.jobs == {}


# -- chord --

def reducer(app: Istos, queue: str = "reduce"):
    """A callback worker on ``app`` recording each call; returns (calls, fired event)."""
    calls: list = []
    fired = asyncio.Event()

    @app.worker(queue)
    async def reduce(body):
        calls.append(body)
        fired.set()

    return calls, fired


async def test_chord_results_arrive_in_member_order_when_members_finish_in_reverse(mesh):
    owner, worker = app_on(mesh, "owner"), app_on(mesh, "worker")
    owner.queue("shard")
    owner.queue("reduce")
    n = 4
    finished = [asyncio.Event() for _ in range(n)]
    calls, fired = reducer(worker)

    @worker.worker("shard", concurrency=n)
    async def shard(i):
        if i + 1 < n:
            await finished[i + 1].wait()  # the last member finishes first
        finished[i].set()
        return i * i

    async with owner.serving(), worker.serving():
        chord_id = await owner.chord("shard", list(range(n)),
                                     callback=("reduce", {"job": "nightly"}))
        await wait_for(fired)
        events = await wait_events(owner, lambda ev: count(ev, "acked") == n + 1)
    acked = [e.job_id for e in events if e.kind == "acked" and e.queue == "shard"]
    assert acked == [f"{chord_id}.{i}" for i in reversed(range(n))]
    assert calls == [{"results": [0, 1, 4, 9], "input": {"job": "nightly"}}]
    assert count(events, "enqueued", f"{chord_id}.callback") == 1


async def test_chord_callback_fires_once_when_a_member_fails_once(mesh):
    app = app_on(mesh, "solo")
    app.queue("shard", retry_backoff_s=0.01)
    app.queue("reduce")
    calls, fired = reducer(app)

    @app.worker("shard", concurrency=3)
    async def shard(i, ctx: JobContext):
        if i == 1 and ctx.attempt == 1:
            raise RuntimeError("transient")
        return f"r{i}"

    async with app.serving():
        chord_id = await app.chord("shard", [0, 1, 2], callback=("reduce", None))
        await wait_for(fired)
        events = await wait_events(app, lambda ev: count(ev, "acked") == 4)
    assert count(events, "nacked", f"{chord_id}.1") == 1
    assert calls == [{"results": ["r0", "r1", "r2"], "input": None}]
    assert count(events, "enqueued", f"{chord_id}.callback") == 1


async def test_chord_member_redelivered_after_lease_expiry_fires_callback_once(mesh):
    """Leases run on a clock the test moves (on the loop's clock a loaded machine could also
    expire member 1's or the redelivery's 0.2 s lease: extra runs)."""
    clock = ManualClock()
    owner = app_on(mesh, "owner", clock=clock)
    owner.queue("shard", lease_s=0.2, sweep_interval_s=0.02)
    owner.queue("reduce")
    worker = app_on(mesh, "worker", clock=clock)
    calls, fired = reducer(worker)
    release, stalled = asyncio.Event(), asyncio.Event()
    work_done: list[tuple[int, int]] = []

    @worker.worker("shard", concurrency=3, poll_interval_s=0.05)
    async def shard(i, ctx: JobContext):
        work_done.append((i, ctx.attempt))
        if i == 0 and ctx.attempt == 1:
            stalled.set()
            await release.wait()  # did its work, then stalls past its lease
        return i + 100

    async with owner.serving():
        async with worker.serving():
            chord_id = await owner.chord("shard", [0, 1], callback=("reduce", "x"))
            await wait_for(stalled)
            await wait_events(owner, lambda ev: count(ev, "acked", f"{chord_id}.1") == 1)
            assert not fired.is_set()  # member 0 has not reported
            clock.advance(0.2)  # member 0's lease ends now: it is redelivered
            await wait_for(fired)
            release.set()  # the first delivery now returns and acks with a stale lease
        # leaving worker.serving() waited for that late ack to be answered
        events = await wait_events(owner, lambda ev: count(ev, "acked") == 3)
        assert owner.owners["shard"].state.jobs == {}
    assert sorted(work_done) == [(0, 1), (0, 2), (1, 1)]
    assert count(events, "lease_expired", f"{chord_id}.0") == 1
    assert count(events, "acked", f"{chord_id}.0") == 1
    assert calls == [{"results": [100, 101], "input": "x"}]
    assert count(events, "enqueued", f"{chord_id}.callback") == 1


async def test_stalled_chord_is_released_by_revive(mesh):
    owner, worker = app_on(mesh, "owner"), app_on(mesh, "worker")
    owner.queue("shard", max_attempts=1, admin=True)  # revive changes a job's fate
    owner.queue("reduce")
    calls, fired = reducer(worker)
    fixed = False

    @worker.worker("shard", concurrency=3)
    async def shard(i):
        if i == 2 and not fixed:
            raise RuntimeError("broken dependency")
        return i

    async with owner.serving(), worker.serving():
        chord_id = await owner.chord("shard", [0, 1, 2], callback=("reduce", "in"))
        member = f"{chord_id}.2"
        await wait_events(owner, lambda ev: count(ev, "dead_lettered", member) == 1
                          and count(ev, "acked") == 2)
        # a plain re-enqueue of the data is a new job: it runs, but the chord stays stalled
        plain = await worker.enqueue("shard", 1)
        await wait_events(owner, lambda ev: count(ev, "acked", plain) == 1)
        assert not fired.is_set()
        assert count(owner.events.recent(), "enqueued", f"{chord_id}.callback") == 0
        fixed = True
        assert await worker.revive("shard", member) == member  # over the mesh
        await wait_for(fired)
        events = await wait_events(owner, lambda ev: count(ev, "acked", member) == 1)
        assert await owner.dead_letters("shard") == []
        with pytest.raises(IstosError, match="no dead job"):
            await worker.revive("shard", member)
    revived = [e for e in events if e.job_id == member and e.kind == "claimed"]
    assert [e.attempt for e in revived] == [1, 1]  # a fresh attempt count
    assert calls == [{"results": [0, 1, 2], "input": "in"}]
    assert count(events, "enqueued", f"{chord_id}.callback") == 1


async def test_chord_barrier_survives_an_owner_restart_on_shared_storage(mesh):
    storage = MemoryStorage(durable=True)
    owner1 = app_on(mesh, "owner1", storage=storage)
    owner1.queue("shard")
    reduce_app = app_on(mesh, "reducer")
    reduce_app.queue("reduce")
    calls, fired = reducer(reduce_app)
    worker = app_on(mesh, "worker")
    go = asyncio.Event()

    @worker.worker("shard", concurrency=4)
    async def shard(i):
        if i >= 2:
            await go.wait()
        return f"s{i}"

    async with reduce_app.serving(), worker.serving():
        async with owner1.serving():
            chord_id = await owner1.chord("shard", [0, 1, 2, 3], callback=("reduce", 7))
            await wait_events(owner1, lambda ev: count(ev, "acked") == 2
                              and count(ev, "claimed") == 4)
        assert set(dict(await storage.scan("wf:shard"))) == {chord_id}
        owner2 = app_on(mesh, "owner2", storage=storage)
        owner2.queue("shard")
        async with owner2.serving():
            assert owner2.owners["shard"].state.counts["leased"] == 2  # recovered
            go.set()
            await wait_for(fired)
            await wait_events(owner2, lambda ev: count(ev, "acked") == 2)
    assert calls == [{"results": ["s0", "s1", "s2", "s3"], "input": 7}]
    events = reduce_app.events.recent()
    assert count(events, "enqueued", f"{chord_id}.callback") == 1
    assert count(events, "duplicate_enqueue") == 0


async def test_empty_chord_fires_its_callback_at_once(mesh):
    app = app_on(mesh, "solo")
    app.queue("shard")
    app.queue("reduce")
    calls, fired = reducer(app)
    async with app.serving():
        await app.chord("shard", [], callback=("reduce", "none"))
        await wait_for(fired)
    assert calls == [{"results": [], "input": "none"}]


async def test_chord_rejects_a_malformed_callback(mesh):
    app = app_on(mesh, "solo")
    async with app.serving():
        with pytest.raises(ConfigError, match="callback"):
            await app.chord("shard", [1], callback="reduce")  # type: ignore[arg-type]


class SlowLink:
    """A network model: messages between two named nodes take ``delay_s``, others are instant."""

    def __init__(self, a: str, b: str, delay_s: float) -> None:
        self.pair, self.delay_s = {a, b}, delay_s

    def delay(self, src: str, dst: str) -> float | None:
        return self.delay_s if {src, dst} == self.pair else 0.0

    def reachable(self, src: str, dst: str) -> bool:
        return True


async def test_concurrent_repeats_of_the_last_ack_fire_the_callback_once():
    """The last member's ack waits on a slow callback enqueue, so the worker times out and
    sends the same ack again while the first is in flight: the barrier fires once."""
    mesh = LocalMesh(SlowLink("owner", "reducer", 0.15))
    owner = app_on(mesh, "owner")
    owner.queue("shard")
    reduce_app = app_on(mesh, "reducer")
    reduce_app.queue("reduce")
    calls, fired = reducer(reduce_app)
    worker = app_on(mesh, "worker", request_timeout_s=0.1)

    # Not parked: a parked claim's reply may take the poll interval, so the acks riding on it
    # are not resent on the short request timeout this test needs.
    @worker.worker("shard", park=False)
    async def shard(i):
        return i

    sent_acks: list[str] = []

    async def note(rec, result):
        sent_acks.append(rec.job_id)

    extend_owners(owner, Hooks(before_ack=note), first=True)
    async with reduce_app.serving(), owner.serving(), worker.serving():
        chord_id = await owner.chord("shard", [0, 1], callback=("reduce", None))
        await wait_for(fired)
        await wait_events(reduce_app, lambda ev: count(ev, "acked") == 1)
        # The last member's ack ends (its barrier cleared) before anything stops: a worker's
        # stop no longer waits out three tries of an ack still in flight.
        await wait_events(owner, lambda ev: count(ev, "acked", f"{chord_id}.1") == 1)
    assert sent_acks.count(f"{chord_id}.1") >= 2  # the last ack really was repeated
    assert calls == [{"results": [0, 1], "input": None}]
    events = reduce_app.events.recent()
    assert count(events, "enqueued", f"{chord_id}.callback") == 1
    assert count(events, "duplicate_enqueue") == 0  # the fired flag stopped a second try
    tombstone = Barrier.decode(await owner.node.storage.get("wf:shard", chord_id))
    assert tombstone.fired and tombstone.results == {}


def callback_outage_apps(mesh: LocalMesh, *, max_attempts: int
                         ) -> tuple[ManualClock, Istos, Istos, Istos]:
    """The owner of ``shard`` (0.2 s leases, a 0.05 s request timeout, on a clock the test
    moves), the callbacks' app (queue ``reduce``, not started) and a worker app whose clock
    stands still (it never sees a lease end)."""
    clock = ManualClock()
    owner = app_on(mesh, "owner", clock=clock, request_timeout_s=0.05)
    owner.queue("shard", lease_s=0.2, sweep_interval_s=0.02, max_attempts=max_attempts)
    reduce_app = app_on(mesh, "reducer")
    reduce_app.queue("reduce")
    return clock, owner, reduce_app, app_on(mesh, "worker", clock=ManualClock())


async def test_failed_callback_enqueue_is_retried_by_the_members_redelivery(mesh):
    """The owner's leases and request timeout run on a clock the test moves, and the worker's
    on one that stands still (it never sees a lease end): on the loop's clock a loaded machine
    could expire a member's 0.2 s lease before its ack went through (a fourth run)."""
    clock, owner, reduce_app, worker = callback_outage_apps(mesh, max_attempts=5)
    calls, fired = reducer(reduce_app)
    runs: list[tuple[int, int]] = []
    rerun = asyncio.Event()

    @worker.worker("shard", concurrency=2, poll_interval_s=0.05)
    async def shard(i, ctx: JobContext):
        runs.append((i, ctx.attempt))
        if ctx.attempt == 2:
            rerun.set()
        return i * 2

    async with owner.serving():
        async with reduce_app.serving():  # the opener reserves the callback on its queue
            chord_id = await owner.chord("shard", [0, 1], callback=("reduce", "y"))
        async with worker.serving():
            # the callback's owner is down: the last member's ack waits on its callback...
            await wait_events(owner, lambda ev: count(ev, "acked") == 1)
            assert len(runs) == 2 and not fired.is_set()
            clock.advance(0.2)  # ...which times out, and that member's lease runs out
            await wait_events(owner, lambda ev: count(ev, "lease_expired") == 1)
            await wait_for(rerun)  # redelivered while the callback's owner is still down
            async with reduce_app.serving():
                await wait_for(fired)
                await wait_events(reduce_app, lambda ev: count(ev, "acked") == 1)
    assert calls == [{"results": [0, 2], "input": "y"}]
    assert len(runs) == 3  # one member ran twice
    assert count(reduce_app.events.recent(), "enqueued", f"{chord_id}.callback") == 1


async def test_a_member_out_of_attempts_with_its_callback_unsent_still_fires_it(mesh):
    """As above, but the member whose ack was refused has no attempt left: its lease runs out
    and it is dead-lettered, never redelivered. Every result is stored, so the member queue's
    owner fires the callback itself once the callback's owner is back: once, with every
    result, and no member runs again."""
    clock, owner, reduce_app, worker = callback_outage_apps(mesh, max_attempts=1)
    calls, fired = reducer(reduce_app)
    runs: list[int] = []

    @worker.worker("shard", concurrency=2, poll_interval_s=0.05)
    async def shard(i):
        runs.append(i)
        return i * 2

    async with owner.serving():
        async with reduce_app.serving():  # the opener reserves the callback on its queue
            chord_id = await owner.chord("shard", [0, 1], callback=("reduce", "y"))
        async with worker.serving():
            await wait_events(owner, lambda ev: count(ev, "acked") == 1)
            clock.advance(0.2)  # the last member's ack times out, and its lease runs out
            await wait_events(owner, lambda ev: count(ev, "dead_lettered") == 1)
            async with reduce_app.serving():
                await wait_for(fired)
                await wait_events(reduce_app, lambda ev: count(ev, "acked") == 1)
    assert calls == [{"results": [0, 2], "input": "y"}]
    assert sorted(runs) == [0, 1]  # no member ran twice
    assert count(reduce_app.events.recent(), "enqueued", f"{chord_id}.callback") == 1


class HeldCallbacks(OwnerExtension):
    """Holds every chord callback's enqueue on its queue's owner until ``gate`` is set, and
    counts those enqueues (a slow or unreachable callback owner, under the test's control)."""

    name = "held_callbacks"
    wraps = ("enqueue",)

    def __init__(self) -> None:
        self.gate, self.arrived = asyncio.Event(), asyncio.Event()
        self.sent = 0

    def wrap(self, op: str, inner: Any) -> Any:
        async def enqueue(msg: dict[str, Any]) -> dict[str, Any]:
            if str(msg.get("job_id") or "").endswith(".callback"):
                self.sent += 1
                self.arrived.set()
                await self.gate.wait()
            return await inner(msg)
        return enqueue


async def test_a_held_callback_enqueue_does_not_block_another_members_ack(mesh):
    """Member 0's first ack stores its result and is then refused (so member 0 stays held);
    both leases run out and member 1's second run completes the barrier, whose callback
    enqueue the callback's owner holds. Member 0's next ack goes through meanwhile (no lock
    is held across that enqueue). Member 1's lease then runs out too, and its third run's ack
    waits for the same firing instead of sending another: the callback is enqueued once."""
    clock = ManualClock()
    owner = app_on(mesh, "owner", clock=clock)
    owner.queue("shard", lease_s=0.2, sweep_interval_s=0.02)
    reduce_app = app_on(mesh, "reducer")
    reduce_app.queue("reduce")
    calls, fired = reducer(reduce_app)
    held = HeldCallbacks()
    extend_owners(reduce_app, held)
    refused = asyncio.Event()

    async def refuse_member_0_once(rec, result):
        if rec.job_id.endswith(".0") and not refused.is_set():
            refused.set()
            raise OwnerUnavailable("test: member 0's first ack is lost after its result")

    extend_owners(owner, Hooks(before_ack=refuse_member_0_once))  # after the chord's hook
    third_ack_of_1 = asyncio.Event()

    async def note(rec, result):
        if rec.job_id.endswith(".1") and rec.attempts == 3:
            third_ack_of_1.set()

    extend_owners(owner, Hooks(before_ack=note), first=True)  # before the chord's hook
    worker = app_on(mesh, "worker", clock=ManualClock())  # never sees a lease end
    first_run_of_1, second_run_of_0 = asyncio.Event(), asyncio.Event()

    @worker.worker("shard", concurrency=4, poll_interval_s=0.05)
    async def shard(i, ctx: JobContext):
        if (i, ctx.attempt) == (1, 1):
            await first_run_of_1.wait()  # runs past its lease; its late ack is stale
        if (i, ctx.attempt) == (0, 2):
            await second_run_of_0.wait()
        return i * 3

    async with reduce_app.serving(), owner.serving(), worker.serving():
        chord_id = await owner.chord("shard", [0, 1], callback=("reduce", "z"))
        await wait_for(refused)
        await wait_events(owner, lambda ev: count(ev, "claimed") == 2)
        clock.advance(0.2)  # both leases end: member 0 and member 1 are redelivered
        await wait_for(held.arrived)  # member 1's second ack sends the callback: held
        second_run_of_0.set()
        await wait_events(owner, lambda ev: count(ev, "acked", f"{chord_id}.0") == 1)
        assert not fired.is_set() and held.sent == 1  # still held, and sent once
        clock.advance(0.2)  # member 1's lease ends while its ack waits: it runs a third time
        await wait_for(third_ack_of_1)  # ...and that ack reached the owner, gate still shut
        assert not fired.is_set() and held.sent == 1
        assert count(owner.events.recent(), "acked", f"{chord_id}.1") == 0
        held.gate.set()
        await wait_for(fired)
        await wait_events(owner, lambda ev: count(ev, "acked", f"{chord_id}.1") == 1)
        first_run_of_1.set()
    assert calls == [{"results": [0, 3], "input": "z"}]
    assert held.sent == 1
    assert count(owner.events.recent(), "claimed", f"{chord_id}.1") == 3
    assert count(owner.events.recent(), "acked", f"{chord_id}.1") == 1  # the third delivery
    assert count(reduce_app.events.recent(), "enqueued", f"{chord_id}.callback") == 1
    tombstone = Barrier.decode(await owner.node.storage.get("wf:shard", chord_id))
    assert tombstone.fired and tombstone.results == {}
