"""The simulator honours start deadlines and stored pauses, and its checker proves "an expired job
never ran", "no job handed out unstarted past its start deadline" and "no claim while paused",
across owner restarts (durable storage) and an HA failover, over many seeds; and the checker
can fail (a broken engine is caught)."""

from __future__ import annotations

import asyncio
import random

import pytest

from istos import JobContext
from istos_nb.sim import Simulation

pytestmark = pytest.mark.fast  # `make check`: no process, server or session

SEEDS = range(200)


def _scenario(seed: int, *, ha: bool = False) -> Simulation:
    rng = random.Random(seed)
    sim = Simulation(seed=seed, storage="durable")
    owners = ("a", "b") if ha else ("owner",)
    for name in owners:
        sim.node(name).queue("q", lease_s=5.0, admin=True, ha=ha, ha_lease_s=2.0)
    w = sim.node("w")

    @w.worker("q", concurrency=1, prefetch=2)
    async def handle(job: int) -> None:
        await asyncio.sleep(0.4)

    producer = sim.node("p")
    for i in range(24):
        kw = {"expires_s": rng.choice([0.5, 1.0, 3.0, 60.0])} if i % 3 else {}
        sim.at(0.25 * i, producer.enqueue, "q", i, job_id=f"j{i}",
               group=f"g{i % 2}", **kw)
    pause_at = rng.uniform(1.0, 3.0)
    sim.at(pause_at, producer.pause, "q", reason="smtp down")
    sim.at(pause_at + 0.5, producer.pause, "q", reason="noisy", group="g1")
    if ha:
        sim.crash("a", at=pause_at + 1.0)
    else:
        sim.restart("owner", at=pause_at + 1.0)
    sim.at(pause_at + 6.0, producer.resume, "q")
    sim.at(pause_at + 9.0, producer.resume, "q", group="g1")
    return sim


def _check(seed: int, ha: bool = False) -> dict[str, int]:
    result = _scenario(seed, ha=ha).run(until=60.0)
    report = result.check()
    assert report["ok"].all(), (seed, report[~report["ok"]].to_dict("records"))
    kinds = [e["kind"] for e in result.events_raw]
    return {"expired": kinds.count("expired"), "ran": len(result.effects),
            "paused": kinds.count("paused")}


def test_deadlines_and_pauses_hold_over_many_seeds():
    totals = {"expired": 0, "ran": 0, "paused": 0}
    for seed in SEEDS:
        for k, v in _check(seed).items():
            totals[k] += v
    # every seed paused twice; some jobs expired, most ran
    assert totals["paused"] == 2 * len(SEEDS)
    assert totals["expired"] > 0 and totals["ran"] > 0


@pytest.mark.parametrize("seed", range(5))
def test_deadlines_and_pauses_hold_across_an_ha_failover(seed: int):
    counts = _check(seed, ha=True)
    assert counts["paused"] == 2


def _retried_past_the_deadline(seed: int) -> Simulation:
    """Each job fails its first attempt and backs off past its start deadline: it started,
    so it runs its retry late rather than expire."""
    sim = Simulation(seed=seed, storage="durable")
    sim.node("owner").queue("q", lease_s=5.0, retry_backoff_s=3.0, retry_jitter=0.0)
    w = sim.node("w")

    @w.worker("q")
    async def handle(job: int, ctx: JobContext) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("first try fails")

    for i in range(5):
        sim.at(0.1 * i, sim.nodes["owner"].enqueue, "q", i, job_id=f"j{i}", expires_s=1.0)
    return sim


def test_a_job_that_ran_once_runs_its_retry_past_the_deadline():
    result = _retried_past_the_deadline(0).run(until=30.0)
    assert result.check()["ok"].all()
    assert len(result.effects) == 5
    assert "expired" not in [e["kind"] for e in result.events_raw]


def test_the_checker_catches_an_expired_job_that_ran(monkeypatch):
    """Break the engine: a job whose deadline passed is expired even after it ran."""
    from istos.core import expiry

    monkeypatch.setattr(expiry, "never_started", lambda rec, leased_now=False: True)
    report = _retried_past_the_deadline(0).run(until=30.0).check().set_index("invariant")
    assert not report.loc["an expired job never ran", "ok"]


def test_the_checker_catches_a_claim_while_paused(monkeypatch):
    """Break the engine: the claim path ignores the pause."""
    from istos.core.state import QueueState

    real = QueueState.claim

    def claim(self, workers, now, **kw):  # type: ignore[no-untyped-def]
        was, self.paused = self.paused, False
        try:
            return real(self, workers, now, **kw)
        finally:
            self.paused = was

    monkeypatch.setattr(QueueState, "claim", claim)
    report = _scenario(1).run(until=60.0).check().set_index("invariant")
    assert not report.loc["no job claimed while its queue or group is paused", "ok"]


def test_a_replay_keeps_the_recorded_start_deadlines():
    """A trace of a run whose jobs had start deadlines, replayed with a slower fleet: the
    deadlines hold in the replay, so jobs that waited too long expire there too."""
    from istos_nb.data.trace import Trace
    from istos_nb.sim import replay

    sim = Simulation(seed=3)
    sim.node("owner").queue("q", lease_s=5.0)
    w = sim.node("w")

    @w.worker("q", concurrency=4)
    async def handle(job: int) -> None:
        await asyncio.sleep(0.5)

    for i in range(20):
        sim.at(0.1 * i, sim.nodes["owner"].enqueue, "q", i, job_id=f"j{i}", expires_s=2.0)
    recorded = sim.run(until=30.0)
    assert "expired" not in [e["kind"] for e in recorded.events_raw]
    trace = Trace.from_events(recorded.job_events(), policy={"lease_s": 5.0})
    assert trace.jobs["expires_s"].round(6).eq(2.0).all()
    slower = replay(trace, workers=1, concurrency=1, seed=3)
    kinds = [e["kind"] for e in slower.events_raw]
    assert kinds.count("expired") > 0
    assert slower.check()["ok"].all()
