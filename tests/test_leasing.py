"""Pure-core tests of lease renewal, progress and cancellation (istos/core/leasing.py), plus the
cancelled state surviving an owner restart on real Redis."""

from __future__ import annotations

import asyncio
import random

import pytest
from helpers import count, wait_events
from services import redis_url
from zenoh_util import unique_prefix

from istos import InvalidProgress, Istos, JobContext
from istos.core import leasing
from istos.core.backoff import BackoffPolicy
from istos.core.records import decode_record, encode_record
from istos.core.state import (
    CANCELLED,
    DEAD,
    DELAYED,
    DONE,
    EXPIRED,
    LEASED,
    READY,
    QueuePolicy,
    QueueState,
)
from istos.transport.local import LocalMesh

RNG = random.Random(1)


def make(**kw) -> QueueState:
    policy = QueuePolicy(**{"lease_s": 10.0, "max_attempts": 3,
                            "backoff": BackoffPolicy(1.0, 8.0, 0.0), **kw})
    return QueueState("q", policy, node="n")


def leased(s: QueueState, job_id: str = "j", now: float = 0.0) -> str:
    s.enqueue(job_id, b"x", now)
    (rec,) = s.claim(["w:f#0"], now)
    return rec.lease_token or ""


def kinds(s: QueueState) -> list[str]:
    return [e.kind for e in s.drain()[1]]


def test_a_renewed_lease_outlives_its_first_deadline_and_expires_at_the_new_one():
    s = make()
    token = leased(s)
    assert leasing.extend(s, {"job_id": "j", "token": token}, 8.0) == "ok"
    assert s.jobs["j"].lease_deadline == 18.0
    assert s.sweep(10.0) == 0 and s.jobs["j"].state == LEASED  # the old deadline is stale
    assert s.next_deadline() == 18.0
    assert s.sweep(18.0) == 1 and s.jobs["j"].state == READY
    assert kinds(s)[-3:] == ["lease_extended", "lease_expired", "retry_scheduled"]


def test_renewal_is_refused_for_a_wrong_token_or_a_settled_job_and_writes_nothing():
    s = make()
    token = leased(s)
    s.drain()
    assert leasing.extend(s, {"job_id": "j", "token": token + "x"}, 1.0) == "stale"
    assert leasing.extend(s, {"job_id": "nope", "token": token}, 1.0) == "stale"
    assert leasing.extend(s, {"job_id": "j", "token": token}, 1.0) == "ok"
    assert s.drain()[0] == []  # a renewal is not written to storage (restore re-leases)
    assert s.ack("j", token, 2.0) == "ok"
    assert leasing.extend(s, {"job_id": "j", "token": token}, 3.0) == "stale"


def test_progress_rides_on_a_renewal_and_is_coalesced():
    s = make()
    token = leased(s)
    s.drain()
    item = {"job_id": "j", "token": token, "progress": 0.5, "note": "half"}
    assert leasing.extend(s, item, 1.0) == "ok"
    assert leasing.extend(s, item, 2.0) == "ok"  # unchanged: no second progress event
    rec = s.jobs["j"]
    assert (rec.progress, rec.progress_note) == (0.5, "half")
    assert kinds(s).count("progress") == 1
    with pytest.raises(InvalidProgress):
        leasing.extend(s, {**item, "progress": 2.0}, 3.0)


def test_cancel_a_waiting_job_is_final_and_kept_for_the_result_ttl():
    s = make(result_ttl_s=100.0)
    s.enqueue("r", b"x", 0.0)
    s.enqueue("d", b"x", 0.0, delay_s=50.0)
    assert leasing.cancel(s, "r", 1.0) == "cancelled"
    assert leasing.cancel(s, "d", 1.0) == "cancelled"
    assert s.claim(["w:f#0"], 60.0) == []  # neither is ever claimed
    assert s.counts[CANCELLED] == 2 and s.counts[READY] == s.counts[DELAYED] == 0
    assert leasing.cancel(s, "r", 2.0) == "too_late"
    s.sweep(101.0)
    assert "r" not in s.jobs and leasing.cancel(s, "r", 102.0) == "unknown"


@pytest.mark.parametrize("final", [DONE, DEAD, CANCELLED, EXPIRED])
def test_cancel_of_a_job_that_already_ended_is_too_late_and_changes_nothing(final):
    """Every final state, an expired start deadline included (a job never run), answers
    ``too_late``: the record, the counts and the events stay as they were."""
    s = make(max_attempts=1, result_ttl_s=100.0, keep_results=True)
    if final == EXPIRED:
        s.enqueue("j", b"x", 0.0, start_by=5.0)
        s.sweep(5.0)  # (no worker claimed it by its start deadline)
    elif final == CANCELLED:
        s.enqueue("j", b"x", 0.0)
        assert leasing.cancel(s, "j", 1.0) == "cancelled"
    else:
        token = leased(s)
        if final == DONE:
            assert s.ack("j", token, 1.0) == "ok"
        else:
            assert s.nack("j", token, 1.0, "boom", RNG) == "ok"
    assert s.jobs["j"].state == final
    s.drain()
    before, counts = encode_record(s.jobs["j"]), dict(s.counts)
    assert leasing.cancel(s, "j", 6.0) == "too_late"
    assert encode_record(s.jobs["j"]) == before and dict(s.counts) == counts
    assert s.drain() == ([], [])


def test_cancel_after_the_lease_expired_is_defined_before_and_after_the_sweep():
    """A lease whose deadline passed but that no sweep ended yet is still leased: the cancel
    marks it (``cancelling``) and the sweep then ends it cancelled; once a sweep handed the job
    back for a retry, a cancel ends it at once."""
    s = make()
    leased(s)
    assert leasing.cancel(s, "j", 10.5) == "cancelling"  # deadline 10.0, not swept yet
    assert s.sweep(10.5) == 1 and s.jobs["j"].state == CANCELLED
    other = make()
    leased(other)
    assert other.sweep(10.0) == 1 and other.jobs["j"].state == READY  # (retry at 11.0)
    assert leasing.cancel(other, "j", 10.5) == "cancelled"


@pytest.mark.parametrize("end", ["nack", "expire"])
def test_a_cancelled_leased_job_is_never_retried_nor_dead_lettered(end):
    s = make()
    token = leased(s)
    assert leasing.cancel(s, "j", 1.0) == "cancelling"
    assert leasing.cancel(s, "j", 1.5) == "cancelling"  # idempotent
    assert leasing.extend(s, {"job_id": "j", "token": token}, 2.0) == "cancel"
    if end == "nack":
        assert s.nack("j", token, 3.0, "JobCancelled: stop", RNG) == "ok"
    else:
        assert s.sweep(10.0) == 1  # the cancel answer did not renew the lease
    rec = s.jobs["j"]
    assert rec.state == CANCELLED and rec.attempts == 1 and "j" not in s.dead
    assert s.claim(["w:f#0"], 100.0) == []
    assert kinds(s).count("cancelled") == 1


def test_an_ack_that_beats_the_cancel_completes_the_job():
    s = make()
    token = leased(s)
    assert leasing.cancel(s, "j", 1.0) == "cancelling"
    assert s.ack("j", token, 2.0) == "ok" and "j" not in s.jobs  # the work had finished


def test_cancel_mark_and_cancelled_state_survive_a_restart():
    s = make()
    leased(s, "run")
    s.enqueue("wait", b"x", 0.0)
    leasing.cancel(s, "run", 1.0)
    leasing.cancel(s, "wait", 1.0)
    stored = {r.job_id: encode_record(r) for r in s.drain()[0] if not isinstance(r, str)}
    fresh = make()
    for raw in stored.values():
        fresh.restore(decode_record(raw), 500.0)
    assert fresh.jobs["wait"].state == CANCELLED
    assert fresh.jobs["run"].cancel_requested and fresh.jobs["run"].state == LEASED
    fresh.sweep(510.0)  # the recovered lease expires: the mark makes it final, not a retry
    assert fresh.jobs["run"].state == CANCELLED and fresh.counts[DEAD] == 0


async def test_the_cancel_op_answers_too_late_for_a_job_whose_start_deadline_passed():
    app = Istos(transport=LocalMesh().transport("o"), node_id="o")
    app.queue("q", admin=True, sweep_interval_s=0.05)
    async with app.serving():
        await app.pause("q", reason="nobody claims: the job waits out its deadline")
        jid = await app.enqueue("q", "x", expires_s=0.2)
        await wait_events(app, lambda ev: count(ev, "expired", jid) == 1, 20.0)
        assert await app.cancel("q", jid) == "too_late"
        reply = await app.client("q").call("cancel", job_id=jid)
        assert reply["ok"] is True and reply["status"] == "too_late"
        assert (await app.result("q", jid))["state"] == "expired"
        assert app.owners["q"].stats()["counts"][CANCELLED] == 0


async def test_cancelled_state_is_stored_and_recovered_on_redis():
    from istos import RedisStoragePlugin

    url, ns = redis_url(), unique_prefix().replace("/", ":")
    mesh = LocalMesh()

    def node() -> Istos:
        app = Istos(RedisStoragePlugin(url, key_prefix=ns), transport=mesh.transport("o"))
        app.queue("q", admin=True)
        return app

    first = node()
    async with first.serving():
        jid = await first.enqueue("q", "x", delay_s=60)
        assert await first.cancel("q", jid) == "cancelled"
    second = node()
    async with second.serving():
        assert await second.result("q", jid) == {"state": "cancelled", "result": None}
        await second.node.storage.apply("jobs:q", [], [jid])  # leave Redis as we found it


async def test_progress_rides_on_the_ack_without_heartbeats():
    mesh = LocalMesh()
    owner, worker = Istos(transport=mesh.transport("o")), Istos(transport=mesh.transport("w"))
    owner.queue("q", keep_results=True)

    @worker.worker("q")
    async def work(job, ctx: JobContext):
        ctx.progress(0.2)
        ctx.progress(1.0, "all rows")
        return job

    async with owner.serving(), worker.serving():
        jid = await owner.enqueue("q", "x")
        await wait_events(owner, lambda ev: count(ev, "acked", jid) == 1)
        why = (await owner.client("q").call("why", job_id=jid))["why"]
    assert why["state"] == "done" and (why["progress"], why["progress_note"]) == (1.0, "all rows")
    assert count(owner.events.recent(), "progress", jid) == 1  # only the latest value is sent


def test_a_stale_prefetched_copy_never_runs_nor_touches_the_new_lease_of_the_same_job():
    from istos.clock import ManualClock
    from istos.core.config import WorkerConfig
    from istos.worker.worker import ClaimedJob, WorkerRunner

    clock = ManualClock(100.0)
    app = Istos(transport=LocalMesh().transport("w"), clock=clock)
    runner = WorkerRunner(WorkerConfig.build("q"), lambda job: None, app.node, app.client("q"))

    def claimed(token: str) -> ClaimedJob:
        return ClaimedJob("j", b"", 1, token, "w:f#0", None, None, None, 3, False)

    old, new = claimed("j.1"), claimed("j.2")
    held_old = runner.leases.hold(old, 100.0, 1.0)
    clock.advance(2.0)  # the first lease ended while it waited; the job is claimed again
    held_new = runner.leases.hold(new, 102.0, 1.0)
    assert runner.leases.verdict(held_old, clock.monotonic()) == "expired"
    runner.leases.finish(held_old, None)
    assert runner.leases.verdict(held_new, clock.monotonic()) == "run"
    assert list(runner.leases.held) == ["j.2"]
    runner.leases.cancel(["j"])
    assert runner.leases.verdict(held_new, clock.monotonic()) == "cancelled"


async def test_bad_extend_and_cancel_requests_get_typed_errors_and_change_nothing():
    from istos import ProtocolError
    from istos.core.leasing import MAX_EXTEND_ITEMS

    mesh = LocalMesh()
    owner, worker = Istos(transport=mesh.transport("o")), Istos(transport=mesh.transport("w"))
    owner.queue("q", admin=True)
    started = asyncio.Event()

    @worker.worker("q")
    async def work(job, ctx: JobContext):
        started.set()
        await asyncio.sleep(30)

    async with owner.serving(), worker.serving():
        jid = await owner.enqueue("q", "x")
        await asyncio.wait_for(started.wait(), 5)
        rec = owner.owners["q"].state.jobs[jid]
        token, deadline = rec.lease_token, rec.lease_deadline
        remote = worker.client("q")
        good = {"job_id": jid, "token": token}
        for bad, error in [
            ({"items": "nope"}, ProtocolError),
            ({"items": [good] * (MAX_EXTEND_ITEMS + 1)}, ProtocolError),
            ({"items": [good, {"job_id": jid, "token": 7}]}, ProtocolError),
            ({"items": [good, {**good, "progress": float("nan")}]}, InvalidProgress),
            ({"items": [good, {**good, "note": "n" * 10_000}]}, InvalidProgress),
            ({}, ProtocolError),
        ]:
            with pytest.raises(error):
                await remote.call("extend", **bad)
        with pytest.raises(ProtocolError):
            await remote.call("cancel", job_id=["not", "a", "string"])
        assert (rec.lease_deadline, rec.progress, rec.cancel_requested) == (deadline, None, None)
        assert (await remote.call("extend", items=[good]))["statuses"] == ["ok"]
        worker.runners[0].kill()


async def test_a_function_that_swallows_its_timeout_is_still_nacked_with_job_timeout():
    mesh = LocalMesh()
    owner, worker = Istos(transport=mesh.transport("o")), Istos(transport=mesh.transport("w"))
    owner.queue("q", max_attempts=1)

    @worker.worker("q", timeout_s=0.05)
    async def stubborn(job):
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "finished anyway"  # swallowed: the run still exceeded its limit

    async with owner.serving(), worker.serving():
        jid = await owner.enqueue("q", "x")
        await wait_events(owner, lambda ev: count(ev, "dead_lettered", jid) == 1)
        (dead,) = await owner.dead_letters("q")
    assert dead["last_error"].startswith("JobTimeout")


async def test_without_heartbeat_or_message_a_worker_learns_of_a_cancel_at_its_next_claim():
    mesh = LocalMesh()
    owner, worker = Istos(transport=mesh.transport("o")), Istos(transport=mesh.transport("w"))
    owner.queue("q", admin=True)
    started, stopped = asyncio.Event(), asyncio.Event()

    @worker.worker("q", concurrency=2, poll_interval_s=0.05)
    async def work(job):
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.set()
            raise

    async with owner.serving(), worker.serving():
        worker.runners[0].leases._sub.close()  # the targeted message never arrives
        jid = await owner.enqueue("q", "x")
        await asyncio.wait_for(started.wait(), 5)
        claims = worker.runners[0].stats.claims
        assert await owner.cancel("q", jid) == "cancelling"
        await asyncio.wait_for(stopped.wait(), 5)  # told in the reply to its idle slot's poll
        assert worker.runners[0].stats.claims > claims
        events = await wait_events(owner, lambda ev: count(ev, "cancelled", jid) == 1)
    assert count(events, "claimed", jid) == 1 and count(events, "retry_scheduled", jid) == 0
