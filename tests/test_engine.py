"""The spec's promises, on the in-process mesh (the same engine code as over Zenoh)."""

from __future__ import annotations

import asyncio
import threading

import pytest
from helpers import count, extend_owners, wait_events

from istos import (
    ConfigError,
    Depends,
    InvalidJob,
    Istos,
    JobContext,
    OwnerUnavailable,
    codec,
)
from istos.clock import ManualClock
from istos.transport.local import LocalMesh

pytestmark = pytest.mark.fast  # `make check`: no process, server or session


@pytest.fixture
def mesh() -> LocalMesh:
    return LocalMesh()


def app_on(mesh: LocalMesh, name: str, **kw) -> Istos:
    return Istos(transport=mesh.transport(name), **kw)


async def test_three_roles_ack_removes_the_job(mesh):
    owner, worker = app_on(mesh, "owner"), app_on(mesh, "worker")
    owner.queue("jobs/email", lease_s=30, max_attempts=5)
    got = []

    @worker.worker("jobs/email", concurrency=4)
    async def send(job):
        got.append(job)

    async with owner.serving(), worker.serving():
        jid = await owner.enqueue("jobs/email", {"to": "a@b.com", "body": "hi"})
        events = await wait_events(owner, lambda ev: count(ev, "acked", jid) == 1)
    assert got == [{"to": "a@b.com", "body": "hi"}]
    assert [e.kind for e in events if e.job_id == jid] == ["enqueued", "claimed", "acked"]
    assert owner.owners == {}  # stopped cleanly


async def test_single_delivery_across_three_apps(mesh):
    owner = app_on(mesh, "owner")
    owner.queue("q", lease_s=30)
    w1, w2 = app_on(mesh, "w1"), app_on(mesh, "w2")
    deliveries: dict[int, list[str]] = {}

    def make(name):
        async def handle(job):
            deliveries.setdefault(job["i"], []).append(name)
            await asyncio.sleep(0)
        return handle

    w1.worker("q", concurrency=4)(make("w1"))
    w2.worker("q", concurrency=4)(make("w2"))
    async with owner.serving(), w1.serving(), w2.serving():
        for i in range(300):
            await owner.enqueue("q", {"i": i})
        await wait_events(owner, lambda ev: count(ev, "acked") == 300)
    assert sorted(deliveries) == list(range(300))
    assert all(len(v) == 1 for v in deliveries.values())
    assert {n for v in deliveries.values() for n in v} == {"w1", "w2"}


async def test_hung_worker_job_redelivered_after_lease_with_attempt_2(mesh):
    # Leases end when the test moves the clock: on the loop's clock a loaded machine could
    # also let the rescuer's 0.3 s lease run out before its ack (a third attempt).
    clock = ManualClock()
    owner = app_on(mesh, "owner", clock=clock)
    owner.queue("q", lease_s=0.3, sweep_interval_s=0.05)
    stuck = app_on(mesh, "stuck", clock=clock, shutdown_grace_s=0.01)
    rescuer = app_on(mesh, "rescuer", clock=clock)
    never, hung = asyncio.Event(), asyncio.Event()
    attempts = []

    @stuck.worker("q")
    async def hang(job, ctx: JobContext):
        attempts.append(("stuck", ctx.attempt))
        hung.set()
        await never.wait()

    async with owner.serving(), stuck.serving():
        jid = await owner.enqueue("q", {"x": 1})
        await asyncio.wait_for(hung.wait(), 5.0)  # it runs (and its slot stays busy)

        @rescuer.worker("q", poll_interval_s=0.05)
        async def rescue(job, ctx: JobContext):
            attempts.append(("rescuer", ctx.attempt, ctx.is_retry, ctx.last_error))

        async with rescuer.serving():
            assert count(owner.events.recent(), "lease_expired", jid) == 0
            clock.advance(0.3)  # the stuck worker's lease ends now
            events = await wait_events(owner, lambda ev: count(ev, "acked", jid) == 1)
    assert attempts == [("stuck", 1), ("rescuer", 2, True, "lease expired")]
    assert count(events, "lease_expired", jid) == 1


async def test_backoff_spacing_and_ctx_predicates(mesh):
    app = app_on(mesh, "solo")
    app.queue("q", max_attempts=3, retry_backoff_s=0.1, retry_jitter=0.0)
    seen: list[tuple[int, bool, bool, str | None]] = []

    @app.worker("q", poll_interval_s=5.0)
    async def flaky(job, ctx: JobContext):
        seen.append((ctx.attempt, ctx.is_retry, ctx.is_last_attempt, ctx.last_error))
        if ctx.attempt < 3:
            raise RuntimeError(f"fail {ctx.attempt}")

    async with app.serving():
        jid = await app.enqueue("q", {})
        events = await wait_events(app, lambda ev: count(ev, "acked", jid) == 1)
    assert seen == [(1, False, False, None), (2, True, False, "RuntimeError: fail 1"),
                    (3, True, True, "RuntimeError: fail 2")]
    claims = [e.t for e in events if e.kind == "claimed"]
    retries = [e.detail["delay_s"] for e in events if e.kind == "retry_scheduled"]
    assert retries == [0.1, 0.2]
    assert claims[1] - claims[0] >= 0.1 and claims[2] - claims[1] >= 0.2


async def test_dead_letters_carry_fields_and_history(mesh):
    app = app_on(mesh, "solo")
    app.queue("q", max_attempts=2, retry_backoff_s=0.01)

    @app.worker("q")
    async def poison(job):
        raise ValueError("bad input")

    async with app.serving():
        jid = await app.enqueue("q", {"n": 7})
        await wait_events(app, lambda ev: count(ev, "dead_lettered", jid) == 1)
        dead = await app.dead_letters("q")
        assert (await app.result("q", jid))["state"] == "dead"
        # re-enqueueing is a plain, deliberate enqueue of the data
        again = await app.enqueue("q", dead[0]["data"])
        assert again != jid
    (d,) = dead
    assert d["job_id"] == jid and d["data"] == {"n": 7} and d["attempts"] == 2
    assert d["last_error"] == "ValueError: bad input"
    assert [h["outcome"] for h in d["history"]] == ["nacked", "nacked"]
    assert d["history"][0]["backoff_s"] > 0 and d["history"][1]["backoff_s"] is None


async def test_priority_then_fifo_delivery_order(mesh):
    owner, worker = app_on(mesh, "owner"), app_on(mesh, "worker")
    owner.queue("q")
    order = []

    @worker.worker("q", concurrency=1)
    async def record(job):
        order.append(job["name"])

    async with owner.serving():
        for name, prio in [("a", 0), ("b", 10), ("c", 0), ("d", 10), ("e", 5)]:
            await owner.enqueue("q", {"name": name}, priority=prio)
        async with worker.serving():
            await wait_events(owner, lambda ev: count(ev, "acked") == 5)
    assert order == ["b", "d", "e", "a", "c"]


async def test_delay_holds_job_back(mesh):
    # Time moves only when the test says, so "not before the delay, and at once after it"
    # are exact readings of the clock, not a real-time bound a loaded machine could break.
    clock = ManualClock()
    app = app_on(mesh, "solo", clock=clock)
    app.queue("q", sweep_interval_s=0.05)

    @app.worker("q", poll_interval_s=60.0)
    async def run(job):
        return None

    async with app.serving():
        jid = await app.enqueue("q", {}, delay_s=0.3)
        clock.advance(0.29)
        early = await app.client("q").call("claim", workers=["probe#0"], node="probe")
        assert early["jobs"] == []  # held back just before its delay ends
        clock.advance(0.01)
        # the owner nudges on promotion: the worker's next poll is a minute of the loop away
        events = await wait_events(app, lambda ev: count(ev, "acked", jid) == 1)
    enq = next(e for e in events if e.kind == "enqueued")
    claim = next(e for e in events if e.kind == "claimed")
    assert enq.detail["delay_s"] == pytest.approx(0.3)
    assert claim.t - enq.t == pytest.approx(0.3)  # not claimed while the clock stood before


async def test_result_in_every_state(mesh):
    # Results expire when the test moves the owner's clock: on the loop's clock a loaded
    # machine could let the 0.3 s result TTL pass before the "done" reading.
    clock = ManualClock()
    owner, worker = app_on(mesh, "owner", clock=clock), app_on(mesh, "worker")
    owner.queue("q", keep_results=True, result_ttl_s=0.3, max_attempts=1,
                sweep_interval_s=0.05)
    release = asyncio.Event()

    @worker.worker("q", concurrency=2)
    async def render(job):
        if job.get("fail"):
            raise RuntimeError("nope")
        await release.wait()
        return {"url": f"/r/{job['doc']}"}

    async with owner.serving():
        jid = await owner.enqueue("q", {"doc": 1})
        assert await owner.result("q", jid) == {"state": "ready", "result": None}
        async with worker.serving():
            await wait_events(owner, lambda ev: count(ev, "claimed", jid) == 1)
            assert (await worker.result("q", jid))["state"] == "leased"
            release.set()
            await wait_events(owner, lambda ev: count(ev, "acked", jid) == 1)
            assert await worker.result("q", jid) == {"state": "done", "result": {"url": "/r/1"}}
            bad = await owner.enqueue("q", {"fail": True})
            await wait_events(owner, lambda ev: count(ev, "dead_lettered", bad) == 1)
            assert (await owner.result("q", bad))["state"] == "dead"
            assert await worker.result("q", jid) == {"state": "done", "result": {"url": "/r/1"}}
            clock.advance(0.3)
            await wait_events(owner, lambda ev: count(ev, "result_expired", jid) == 1)
            assert await owner.result("q", jid) == {"state": "unknown", "result": None}
            assert (await owner.result("q", "no-such-id"))["state"] == "unknown"


async def test_idempotent_enqueue(mesh):
    app = app_on(mesh, "solo")
    app.queue("q")
    async with app.serving():
        a = await app.enqueue("q", {"v": 1}, job_id="order-42")
        b = await app.enqueue("q", {"v": 2}, job_id="order-42")
        assert a == b == "order-42"
        owner = app.owners["q"]
        assert owner.state.counts["ready"] == 1
        assert codec.decode_body(owner.state.jobs["order-42"].body) == {"v": 1}


async def test_depends_resolved_before_ctx_and_cleaned_up(mesh):
    app = app_on(mesh, "solo")
    app.queue("q")
    log: list[str] = []

    def config():
        return {"dsn": "db://"}

    async def session(cfg=Depends(config)):
        log.append("open " + cfg["dsn"])
        yield "SESSION"
        log.append("close")

    def ctx_provider():
        return "not-a-context"

    @app.worker("q")
    async def handle(job, db=Depends(session), ctx=Depends(ctx_provider)):
        log.append(f"run {db} {ctx}")

    async with app.serving():
        jid = await app.enqueue("q", {})
        await wait_events(app, lambda ev: count(ev, "acked", jid) == 1)
    assert log == ["open db://", "run SESSION not-a-context", "close"]


async def test_plain_function_worker_runs_in_a_thread(mesh):
    app = app_on(mesh, "solo")
    app.queue("q")
    threads = []

    @app.worker("q", concurrency=2)
    def blocking(job, ctx: JobContext):
        threads.append((threading.current_thread().name, ctx.attempt))

    async with app.serving():
        jid = await app.enqueue("q", {})
        await wait_events(app, lambda ev: count(ev, "acked", jid) == 1)
    assert threads[0][0].startswith("istos-worker") and threads[0][1] == 1


@pytest.mark.parametrize("options,name", [
    ({"lease_s": 0}, "lease_s"), ({"lease_s": -1}, "lease_s"),
    ({"max_attempts": 0}, "max_attempts"), ({"retry_backoff_s": -1}, "retry_backoff_s"),
    ({"retry_jitter": 2}, "retry_jitter"), ({"result_ttl_s": 0}, "result_ttl_s"),
    ({"retry_backoff_s": 10, "retry_backoff_max_s": 1}, "retry_backoff_max_s"),
])
def test_invalid_queue_options_raise_value_error_naming_them(options, name):
    app = Istos(transport=LocalMesh().transport("x"))
    with pytest.raises(ValueError, match=name):
        app.queue("q", **options)
    with pytest.raises(ConfigError):
        app.queue("bad*name")


async def test_bad_enqueue_input_is_refused_before_sending(mesh):
    app = app_on(mesh, "solo")
    app.queue("q")
    async with app.serving():
        with pytest.raises(InvalidJob, match="cannot be encoded"):
            await app.enqueue("q", {"f": object()})
        with pytest.raises(InvalidJob, match="limit"):
            await app.enqueue("q", b"x" * (2 << 20))
        with pytest.raises(ValueError, match="delay_s"):
            await app.enqueue("q", {}, delay_s=-1)
        with pytest.raises(ValueError, match="priority"):
            await app.enqueue("q", {}, priority="high")
        assert app.owners["q"].state.jobs == {}  # nothing reached the owner


async def test_enqueue_to_unserved_queue_raises_owner_unavailable_in_bounded_time(mesh):
    app = app_on(mesh, "lonely", request_timeout_s=0.3)
    async with app.serving():
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(OwnerUnavailable, match="nobody"):
            await app.enqueue("nobody", {})
        assert loop.time() - start < 1.5


async def test_malformed_message_gets_error_reply_and_owner_keeps_serving(mesh):
    owner = app_on(mesh, "owner")
    owner.queue("q")
    probe = mesh.transport("probe")
    await probe.start()
    async with owner.serving():
        for junk in (b"\xc1garbage", codec.encode_message({"v": 99, "op": "claim"}),
                     codec.encode_message({"v": 1, "op": "explode"}),
                     codec.encode_message({"v": 1, "op": "enqueue"})):
            reply = codec.decode_message(await probe.query("istos/q/q/rpc/produce", junk, 1.0)) \
                if junk[:1] != b"\xc1" else None
            if reply is not None:
                assert reply["ok"] is False and reply["error"] == "ProtocolError"
        raw = await probe.query("istos/q/q/rpc/work", b"\xc1garbage", 1.0)
        assert codec.decode_message(raw)["error"] == "ProtocolError"
        assert await owner.enqueue("q", {"still": "works"})
    await probe.close()


async def test_prefetch_holds_more_leases_but_runs_at_most_concurrency(mesh):
    owner, worker = app_on(mesh, "owner"), app_on(mesh, "worker")
    owner.queue("q")
    running, peak_running, peak_leased = 0, 0, 0
    gate, two_running = asyncio.Event(), asyncio.Event()

    @worker.worker("q", concurrency=2, prefetch=3)
    async def work(job):
        nonlocal running, peak_running, peak_leased
        running += 1
        peak_running = max(peak_running, running)
        peak_leased = max(peak_leased, owner.owners["q"].state.counts["leased"])
        if running == 2:
            two_running.set()
        await gate.wait()
        running -= 1

    async with owner.serving():
        for i in range(10):
            await owner.enqueue("q", {"i": i})
        async with worker.serving():
            await wait_events(owner, lambda ev: count(ev, "claimed") == 5)
            await asyncio.wait_for(two_running.wait(), 5)
            assert owner.owners["q"].state.counts["leased"] == 5  # 2 running + 3 prefetched
            assert running == 2  # the prefetched three wait for an execution slot
            gate.set()
            events = await wait_events(owner, lambda ev: count(ev, "acked") == 10)
    assert peak_running == 2 and peak_leased == 5
    claims = [e.detail for e in events if e.kind == "claimed"]
    assert len(claims) == 10


def test_prefetch_must_be_a_non_negative_integer():
    app = Istos(transport=LocalMesh().transport("x"))
    with pytest.raises(ConfigError, match="prefetch"):
        app.worker("q", prefetch=-1)


async def test_oversized_message_is_refused_with_an_error_reply(mesh):
    owner = app_on(mesh, "owner")
    owner.queue("q")
    probe = mesh.transport("probe")
    await probe.start()
    async with owner.serving():
        huge = codec.encode_message({"v": 1, "op": "enqueue", "job_id": "big",
                                     "body": b"x" * (3 << 20)})
        reply = codec.decode_message(await probe.query("istos/q/q/rpc/produce", huge, 1.0))
        assert reply["ok"] is False and reply["error"] == "ProtocolError"
        assert "exceeds" in reply["message"]
        assert "big" not in owner.owners["q"].state.jobs
        assert await owner.enqueue("q", {"still": "serving"})
    await probe.close()


async def test_automatic_prefetch_only_for_jobs_short_next_to_the_lease(mesh):
    owner = app_on(mesh, "owner")
    owner.queue("short", lease_s=30.0)
    owner.queue("long", lease_s=1.0)
    worker = app_on(mesh, "worker")

    @worker.worker("short", concurrency=2)
    async def quick(job):
        return None

    @worker.worker("long", concurrency=2)
    async def slow(job):
        await asyncio.sleep(0.02)  # 2% of its 1 s lease: too long to hold prefetched jobs

    async with owner.serving():
        for i in range(200):
            await owner.enqueue("short", {"i": i})
            await owner.enqueue("long", {"i": i})
        async with worker.serving():
            events = await wait_events(
                owner, lambda ev: count(ev, "acked") == 400, timeout_s=30)
            held = {r.config.queue: r.stats.peak_held for r in worker.runners}
    long = [e for e in events if e.queue == "long"]
    # Counted by the worker, not from the owner's events: an ack sent in its own settle
    # request can reach the owner after the claim for the freed slot (a third lease for an
    # instant on the owner's side although the worker runs two jobs).
    assert held["short"] > 2  # warmed up: claims ran ahead of the two slots
    assert held["long"] == 2  # never more jobs held than slots
    assert {e.worker for e in long if e.kind == "claimed"} == {"worker:slow#0", "worker:slow#1"}


def test_automatic_prefetch_depth_covers_one_claim_round_trip_within_its_caps(mesh):
    from istos.core.config import WorkerConfig
    from istos.worker.worker import AUTO_PREFETCH_FACTOR, WorkerRunner

    app = app_on(mesh, "w")
    runner = WorkerRunner(WorkerConfig.build("q", concurrency=8), lambda job: None, app.node,
                          app.client("q"))
    assert len(runner.slot_ids) == 8 * (1 + AUTO_PREFETCH_FACTOR)
    runner._lease_s, runner._runs_seen = 30.0, 100
    runner._avg_run_s, runner._avg_claim_s = 0.010, 0.0005  # jobs longer than a round trip
    assert runner._prefetch_now() == 8  # the floor: concurrency
    runner._avg_run_s = 0.0001  # a round trip runs 5 jobs per slot: 40 wanted, 32 allowed
    assert runner._prefetch_now() == 8 * AUTO_PREFETCH_FACTOR
    runner._avg_run_s = 0.0002  # 20 jobs cover the round trip
    assert runner._prefetch_now() == 20
    # A slow round trip asks for 400, but 1% of a 30 ms lease is 1.5 run times: 12 at most.
    runner._lease_s, runner._avg_claim_s = 0.03, 0.01
    assert runner._prefetch_now() == 12
    runner._avg_run_s = 0.001  # 2% of the lease: no prefetch at all
    assert runner._prefetch_now() == 0
    fixed = WorkerRunner(WorkerConfig.build("q", concurrency=8, prefetch=3), lambda job: None,
                         app.node, app.client("q"))
    assert len(fixed.slot_ids) == 11 and fixed._prefetch_now() == 3


async def test_enqueue_refuses_bad_arguments_every_time_and_stores_nothing(mesh):
    owner = app_on(mesh, "owner")
    owner.queue("q")
    async with owner.serving():
        await owner.enqueue("q", {"ok": 1}, priority=3, delay_s=0)  # the fast path
        for _ in range(2):  # a refused value stays refused (nothing cached for it)
            for kwargs in ({"priority": True}, {"priority": 2**40}, {"priority": "1"},
                           {"delay_s": -1}, {"delay_s": float("nan")}, {"delay_s": True}):
                with pytest.raises(ConfigError):
                    await owner.enqueue("q", {"bad": kwargs}, **kwargs)
            for name in ("a*b", "", "a//b"):
                with pytest.raises(ConfigError):
                    await owner.enqueue(name, {})
        assert owner.owners["q"].stats()["counts"]["ready"] == 1


async def test_an_ack_hook_sees_every_ack_unless_it_asks_for_workflow_steps_only(mesh):
    from istos.owner.extension import Hooks

    owner = app_on(mesh, "owner")
    owner.queue("q")
    every: list[str] = []
    steps_only: list[str] = []

    async def note_every(rec, result):
        every.append(rec.job_id)

    async def note_step(rec, result):
        steps_only.append(rec.job_id)

    extend_owners(owner, Hooks(before_ack=note_every),
                  Hooks(before_ack=note_step, before_ack_meta_only=True))

    @owner.worker("q", concurrency=2)
    async def run(job):
        return None

    async with owner.serving():
        ids = [await owner.enqueue("q", {"i": i}) for i in range(5)]
        await wait_events(owner, lambda ev: count(ev, "acked") == 5)
        chain_id = await owner.chain(["q", "q"], {"step": 0})
        await wait_events(owner, lambda ev: count(ev, "acked") == 7)
    steps = sorted(set(every) - set(ids))
    assert len(every) == 7 and set(ids) <= set(every)  # plain jobs and workflow steps alike
    assert len(steps) == 2 and chain_id in steps
    assert sorted(steps_only) == steps  # only the jobs that carry workflow meta
