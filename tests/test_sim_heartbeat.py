"""Heartbeats, run timeouts and cancellation in the simulator (virtual time), and the checker's
two invariants about them, including that each can fail."""

from __future__ import annotations

import asyncio

import pytest

from istos import JobContext
from istos_nb.sim import Simulation
from istos_nb.sim.checker import RunRecord
from istos_nb.sim.checker_leases import lease_findings

pytestmark = pytest.mark.fast  # `make check`: no process, server or session


def findings(result) -> dict[str, tuple[bool, str]]:
    report = result.check()
    return {r.invariant: (r.ok, r.detail) for r in report.itertuples()}


HB = "no lease expired while its heart-beating holder was alive and connected"
CANCEL = "a cancelled job never runs again"


def long_jobs_sim(*, heartbeat: bool, partition: bool = False) -> Simulation:
    sim = Simulation(seed=3)
    owner = sim.node("owner")
    owner.queue("q", lease_s=5.0, max_attempts=5, retry_backoff_s=1.0)
    for name in ("w1", "w2"):
        w = sim.node(name, clock_skew_s=1.5, clock_drift_ppm=200)

        @w.worker("q", concurrency=2, prefetch=2, heartbeat=heartbeat)
        async def slow(job, ctx: JobContext):
            ctx.progress(0.5)
            await asyncio.sleep(30.0)  # six leases long

    for i in range(6):
        sim.at(0.0, owner.enqueue, "q", {"i": i}, job_id=f"j{i}")
    if partition:
        sim.partition({"w1"}, {"owner", "w2"}, at=10.0, heal_at=200.0)
    return sim


def test_heartbeats_on_virtual_time_keep_long_jobs_single_and_the_checker_clean():
    result = long_jobs_sim(heartbeat=True).run(until=200.0)
    ev = result.events
    assert (ev.kind == "lease_expired").sum() == 0
    assert (ev.kind == "claimed").sum() == 6 and (ev.kind == "acked").sum() == 6
    assert (ev.kind == "lease_extended").sum() > 6 * 30 / (5 / 3) * 0.9
    assert result.counts["duplicated"] == 0
    got = findings(result)
    assert all(ok for ok, _ in got.values()), got
    assert got[HB][1] == "0 expiries explained"


def test_without_heartbeats_the_same_jobs_run_many_times():
    result = long_jobs_sim(heartbeat=False).run(until=200.0)
    assert result.counts["duplicated"] > 0  # the failure mode heartbeats remove
    assert findings(result)[HB] == (True, "no heart-beating worker")


def test_a_partition_stops_heartbeats_and_the_job_comes_back_within_a_lease():
    result = long_jobs_sim(heartbeat=True, partition=True).run(until=250.0)
    ev = result.events
    expired = ev[ev.kind == "lease_expired"]
    assert len(expired) >= 1 and set(expired.worker.str.split(":").str[0]) == {"w1"}
    # The last renewal reached the owner at most lease_s / 3 before the cut at t=10.
    assert expired.t.min() >= 10.0 and expired.t.max() <= 10.0 + 5.0 + 1.0
    got = findings(result)
    assert got[HB][0] and got[HB][1].endswith("expiries explained"), got[HB]
    assert result.counts["lost"] == 0


def test_cancel_in_the_simulator_and_the_job_never_runs_again():
    sim = Simulation(seed=5)
    owner = sim.node("owner")
    owner.queue("q", lease_s=3.0, admin=True)
    w = sim.node("w")
    runs: list[str] = []

    @w.worker("q", heartbeat=True, timeout_s=20.0)
    async def work(job, ctx: JobContext):
        runs.append(ctx.job_id)
        await asyncio.sleep(60.0)

    sim.at(0.0, owner.enqueue, "q", "run", job_id="running")
    sim.at(0.0, owner.enqueue, "q", "wait", job_id="waiting", delay_s=100.0)
    sim.at(5.0, owner.cancel, "q", "running")
    sim.at(5.0, owner.cancel, "q", "waiting")
    result = sim.run(until=300.0)
    ev = result.events
    assert runs == ["running"]
    assert list(ev[ev.job_id == "waiting"].kind) == ["enqueued", "cancelled"]
    kinds = [k for k in ev[ev.job_id == "running"].kind if k != "lease_extended"]
    assert kinds == ["enqueued", "claimed", "cancel_requested", "nacked", "cancelled"]
    cancelled_at = ev[(ev.job_id == "running") & (ev.kind == "cancelled")].t.iloc[0]
    assert cancelled_at <= 5.0 + 0.1  # told at once (targeted message), not at the lease
    assert all(ok for ok, _ in findings(result).values())


def test_run_timeout_on_virtual_time_dead_letters_after_max_attempts():
    sim = Simulation(seed=2)
    owner = sim.node("owner")
    owner.queue("q", lease_s=3.0, max_attempts=3, retry_backoff_s=1.0, retry_jitter=0.0)
    w = sim.node("w")

    @w.worker("q", heartbeat=True, timeout_s=10.0)
    async def hang(job):
        await asyncio.Event().wait()

    sim.at(0.0, owner.enqueue, "q", "x", job_id="h")
    result = sim.run(until=100.0)
    ev = result.events
    nacks = ev[(ev.job_id == "h") & (ev.kind == "nacked")]
    assert len(nacks) == 3 and (ev.kind == "lease_expired").sum() == 0
    assert all(str(e).startswith("JobTimeout") for e in nacks.error)
    assert list(ev[ev.job_id == "h"].kind)[-1] == "dead_lettered"
    claims = ev[(ev.job_id == "h") & (ev.kind == "claimed")].t.tolist()
    assert 10.0 <= claims[1] - claims[0] <= 10.0 + 1.0 + 0.1  # the timeout, then the backoff
    renewals = ev[(ev.job_id == "h") & (ev.kind == "lease_extended")]
    for attempt, claimed_at in enumerate(claims, start=1):  # never renewed past the timeout
        times = renewals[renewals.attempt == attempt].t
        assert len(times) >= 8 and times.max() <= claimed_at + 10.0 + 0.01


def _row(t, kind, job="j", attempt=1, worker="w:f#0", node="owner", **detail):
    return {"t": t, "t_node": t, "node": node, "queue": "q", "job_id": job, "kind": kind,
            "attempt": attempt, "worker": worker, "detail": detail}


def _record(events, effects=(), heartbeat=frozenset({("w", "q")})) -> dict[str, bool]:
    rec = RunRecord(events=list(events), attempts=[], effects=list(effects), queues={},
                    held=set(), volatile=False, heartbeat=set(heartbeat))
    return {f.invariant: f.ok for f in lease_findings(rec)}


def test_the_checker_catches_an_unexplained_expiry_and_a_rerun_after_cancel():
    expiry = [_row(0.0, "claimed"), _row(5.0, "lease_expired", deadline=5.0)]
    assert _record(expiry)[HB] is False
    assert _record([*expiry[:1], _row(2.0, "crashed", job="", node="w"), expiry[1]])[HB]
    assert _record(expiry, heartbeat=set())[HB]  # not a heart-beating holder
    cut = _row(1.0, "partitioned", job="", node="w", other="owner")
    assert _record([expiry[0], cut, expiry[1]])[HB]
    rerun = [_row(0.0, "enqueued"), _row(1.0, "cancelled", attempt=0),
             _row(2.0, "claimed", attempt=1)]
    assert _record(rerun)[CANCEL] is False
    assert _record(rerun[:2], effects=[{"job_id": "j", "queue": "q", "attempt": 1,
                                        "t": 3.0}])[CANCEL] is False
    assert _record(rerun[:2])[CANCEL]


def test_frames_show_renewals_cancelled_outcome_and_progress():
    from istos_nb.data.frames import depth_frame, jobs_frame, leases_frame

    sim = Simulation(seed=9)
    owner = sim.node("owner")
    owner.queue("q", lease_s=3.0, admin=True)
    w = sim.node("w")

    @w.worker("q", heartbeat=True)
    async def work(job, ctx: JobContext):
        ctx.progress(0.25, "started")
        await asyncio.sleep(1.5)
        ctx.progress(0.75)  # rides on the next heartbeat
        await asyncio.sleep(60.0)

    sim.at(0.0, owner.enqueue, "q", "x", job_id="c")
    sim.at(10.0, owner.cancel, "q", "c")
    events = sim.run(until=20.0).job_events()
    leases = leases_frame(events)
    assert len(leases) == 1 and leases.outcome[0] == "cancelled"
    assert 8 <= leases.renewals[0] <= 10  # ten seconds at 1 s intervals
    assert leases.deadline[0] > leases.start[0] + 3.0  # moved by the renewals
    jobs = jobs_frame(events).set_index("job_id")
    assert jobs.state["c"] == "cancelled" and jobs.progress["c"] == 0.75
    assert jobs.progress_note["c"] is None and jobs.finished_at["c"] >= 10.0
    assert depth_frame(events).iloc[-1][["ready", "leased"]].tolist() == [0, 0]


def test_heartbeats_carry_long_jobs_through_an_ha_failover():
    sim = Simulation(seed=11, storage="durable")
    for name in ("o1", "o2"):
        sim.node(name).queue("q", lease_s=3.0, ha=True)
    w = sim.node("w")

    @w.worker("q", heartbeat=True, concurrency=2)
    async def slow(job, ctx: JobContext):
        await asyncio.sleep(30.0)

    for i in range(3):
        sim.at(1.0, w.enqueue, "q", {"i": i}, job_id=f"j{i}")
    sim.crash("o1", at=10.0)  # the leader dies mid-run; o2 recovers the leases and renews them
    result = sim.run(until=120.0)
    ev = result.events
    assert (ev.kind == "lease_expired").sum() == 0
    assert set(ev[ev.kind == "acked"].node) == {"o2"} and (ev.kind == "claimed").sum() == 3
    assert result.counts["ok"] == 3 and result.counts["duplicated"] == 0
    assert (ev[(ev.kind == "lease_extended")].node == "o2").sum() > 0
    assert all(ok for ok, _ in findings(result).values())
