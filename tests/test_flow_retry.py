"""istos.Retry (retry-after): the worker's chosen wait, not the backoff curve. In-process,
over real Zenoh, on every storage, and in the simulator with the checker's invariant."""

from __future__ import annotations

import asyncio

import pytest
import test_durable
from helpers import count, wait_events
from zenoh_util import isolated_configs, unique_prefix

import istos
from istos import ConfigError, Istos, JobContext, Retry
from istos.core.backoff import BackoffPolicy
from istos.core.state import QueuePolicy, QueueState
from istos.transport.local import LocalMesh
from istos_nb.sim import Simulation

storage_factory = test_durable.storage_factory  # the fixture: memory, Redis, PostgreSQL, SQLite


def _retried(events, job_id):
    return [e for e in events if e.kind == "retry_scheduled" and e.job_id == job_id]


def test_retry_is_in_the_error_tree_and_checks_its_wait():
    assert issubclass(Retry, istos.IstosError) and "Retry" in istos.__all__
    for bad in (-1, float("nan"), float("inf"), "30", True):
        with pytest.raises(ConfigError, match="after_s"):
            Retry(bad)
    with pytest.raises(ConfigError, match="reason"):
        Retry(1, reason=429)  # type: ignore[arg-type]
    assert Retry(2, "429").after_s == 2.0


def test_pure_state_waits_after_s_capped_by_the_policy():
    import random

    state = QueueState("q", QueuePolicy(max_attempts=3,
                                        backoff=BackoffPolicy(base_s=1.0, max_s=50.0)))
    state.enqueue("j", b"x", 0.0)
    (rec,) = state.claim(["w"], 0.0)
    assert state.nack("j", rec.lease_token, 1.0, "Retry: 429", random.Random(0),
                      retry_after=30.0) == "ok"
    assert rec.state == "delayed" and rec.ready_at == 31.0 and rec.attempts == 1
    assert rec.history[-1].error == "Retry: 429" and rec.history[-1].backoff_s == 30.0
    assert state.claim(["w"], 30.9) == []
    (rec,) = state.claim(["w"], 31.0)
    state.nack("j", rec.lease_token, 40.0, "Retry: slow down", random.Random(0),
               retry_after=3600.0)
    assert rec.ready_at == 90.0  # capped by retry_backoff_max_s
    (rec,) = state.claim(["w"], 90.0)
    state.nack("j", rec.lease_token, 91.0, "Retry: 429", random.Random(0), retry_after=1.0)
    assert rec.state == "dead"  # the attempt counts: dead after max_attempts


async def _retry_once(owner: Istos, worker: Istos, queue: str, *, thread: bool) -> None:
    if thread:
        @worker.worker(queue)
        def handle(job, ctx: JobContext):  # a thread worker uses ctx.retry_after
            if ctx.attempt == 1:
                ctx.retry_after(0.4, "429 from the API")
            return None
    else:
        @worker.worker(queue)
        async def handle(job, ctx: JobContext):
            if ctx.attempt == 1:
                raise Retry(after_s=0.4, reason="429 from the API")


async def _check_retry(owner: Istos, queue: str, timeout_s: float) -> None:
    jid = await owner.enqueue(queue, {"n": 1})
    events = await wait_events(owner, lambda ev: count(ev, "acked", jid) == 1, timeout_s)
    (retry,) = _retried(events, jid)
    assert retry.detail["delay_s"] == pytest.approx(0.4)
    assert retry.detail["retry_after"] == pytest.approx(0.4)
    assert retry.detail["error"] == "Retry: 429 from the API"
    nacked = next(e for e in events if e.kind == "nacked" and e.job_id == jid)
    second = [e for e in events if e.kind == "claimed" and e.job_id == jid][1]
    assert second.t >= nacked.t + 0.4 - 1e-6  # not before the worker's chosen wait


@pytest.mark.parametrize("thread", [False, True])
async def test_retry_after_in_process(thread):
    mesh = LocalMesh()
    owner = Istos(transport=mesh.transport("owner"))
    owner.queue("q", retry_backoff_s=60.0, retry_backoff_max_s=600.0, keep_results=True)
    worker = Istos(transport=mesh.transport("w"))
    await _retry_once(owner, worker, "q", thread=thread)
    async with owner.serving(), worker.serving():
        await _check_retry(owner, "q", 10.0)


async def test_retry_after_over_zenoh_records_the_reason_in_history():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q", max_attempts=2, retry_backoff_s=60.0, retry_backoff_max_s=600.0)
    worker = Istos(zenoh=configs[1], prefix=prefix, node_id="w")

    @worker.worker("q", poll_interval_s=0.2)
    async def handle(job, ctx: JobContext):
        raise Retry(after_s=0.3, reason="429")

    async with owner.serving(), worker.serving():
        jid = await owner.enqueue("q", {"n": 1})
        await wait_events(owner, lambda ev: count(ev, "dead_lettered", jid) == 1, 30.0)
        (dead,) = await owner.dead_letters("q")
    assert dead["attempts"] == 2
    assert [h["error"] for h in dead["history"]] == ["Retry: 429", "Retry: 429"]
    assert dead["history"][0]["backoff_s"] == pytest.approx(0.3)


async def test_retry_after_on_every_storage(storage_factory):
    mesh = LocalMesh()
    owner = Istos(storage=storage_factory(), transport=mesh.transport("owner"))
    owner.queue("q", retry_backoff_s=60.0, retry_backoff_max_s=600.0)
    worker = Istos(transport=mesh.transport("w"))
    await _retry_once(owner, worker, "q", thread=False)
    async with owner.serving(), worker.serving():
        await _check_retry(owner, "q", 20.0)


def test_simulated_retry_after_is_honoured_and_checked():
    sim = Simulation(seed=3)
    owner = sim.node("owner")
    owner.queue("q", max_attempts=4, retry_backoff_s=1.0, retry_backoff_max_s=20.0)
    w = sim.node("w", clock_skew_s=0.5)

    @w.worker("q", concurrency=2)
    async def handle(job, ctx: JobContext):
        await asyncio.sleep(0.1)
        if ctx.attempt < 3:
            raise Retry(after_s=15.0 * ctx.attempt, reason="429")  # 15 s, then 30 (capped 20)

    sim.enqueue_jobs("owner", "q", 5, rate=1.0)
    result = sim.run(until=200.0)
    report = result.check()
    assert report["ok"].all(), report
    delays = sorted({round(e["detail"]["delay_s"], 6) for e in result.events_raw
                     if e["kind"] == "retry_scheduled"})
    assert delays == [15.0, 20.0]
    assert result.counts["ok"] == 5


def test_checker_catches_a_retry_that_ignored_the_worker(monkeypatch):
    """The invariant can fail: make the owner use the backoff curve instead."""
    from istos.core import state as state_mod

    real = state_mod.QueueState._fail

    def ignore(self, rec, now, outcome, error, rng, retry_after=None):
        real(self, rec, now, outcome, error, rng, None)
        if retry_after is not None:
            self.events[-1].detail["retry_after"] = retry_after

    monkeypatch.setattr(state_mod.QueueState, "_fail", ignore)
    sim = Simulation(seed=3)
    owner = sim.node("owner")
    owner.queue("q", max_attempts=3, retry_backoff_s=1.0)
    w = sim.node("w")

    @w.worker("q")
    async def handle(job, ctx: JobContext):
        if ctx.attempt == 1:
            raise Retry(after_s=15.0)

    sim.enqueue_jobs("owner", "q", 1)
    report = sim.run(until=100.0).check().set_index("invariant")
    assert not report.loc["retry delays respect the backoff policy", "ok"]
