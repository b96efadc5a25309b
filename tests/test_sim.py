"""The simulator: the real engine under virtual time, faults, determinism, the checker."""

from __future__ import annotations

import asyncio
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from sim_scenarios import faulty_scenario

from istos import JobContext
from istos.core.backoff import BackoffPolicy, delay_bounds
from istos_nb.sim import InvariantViolation, ScenarioError, Simulation


def contract_sim() -> Simulation:
    sim = Simulation(seed=7)
    owner = sim.node("owner")
    owner.queue("jobs/email", lease_s=30, max_attempts=5, retry_backoff_s=1.0)
    w = sim.node("worker-a", clock_skew_s=2.0, clock_drift_ppm=50)

    @w.worker("jobs/email", concurrency=2)
    async def send(job, ctx):
        await asyncio.sleep(job["work_s"])

    sim.at(0.0, owner.enqueue, "jobs/email", {"work_s": 3})
    sim.at(11.0, owner.enqueue, "jobs/email", {"work_s": 3})
    sim.crash("worker-a", at=12.0, restart_after=30.0)
    sim.partition({"worker-a"}, {"owner"}, at=40.0, heal_at=60.0)
    sim.restart("owner", at=100.0)
    return sim


def test_the_contract_example_runs_fast_and_checks_clean():
    # 600 virtual seconds, not 600 real ones: a real-time run fails the suite's timeout (120 s)
    result = contract_sim().run(until=600.0)
    ev = result.events
    for column in ("t", "node", "queue", "job_id", "kind", "attempt", "worker"):
        assert column in ev.columns
    kinds = set(ev["kind"])
    assert {"enqueued", "claimed", "acked", "lease_expired", "retry_scheduled", "crashed",
            "restarted"} <= kinds
    jobs = result.jobs.set_index("job_id")
    for column in ("queue", "state", "attempts", "deliveries", "enqueued_at", "finished_at",
                   "last_error"):
        assert column in jobs.columns
    assert list(jobs["state"]) == ["done", "done"]
    second = jobs.iloc[1]
    assert second["attempts"] == 2 and second["last_error"] == "lease expired"
    report = result.check()
    assert report["ok"].all(), report
    assert result.counts["ok"] == 2 and result.counts["lost"] == 0


def test_crashed_worker_job_is_redelivered_after_the_lease_on_virtual_time():
    sim = Simulation(seed=1)
    owner = sim.node("owner")
    owner.queue("q", lease_s=30.0)
    seen = []
    for name in ("a", "b"):
        node = sim.node(name)

        @node.worker("q")
        async def work(job, ctx: JobContext, _name=name):
            seen.append((_name, ctx.attempt, asyncio.get_running_loop().time()))
            await asyncio.sleep(10)

    sim.at(1.0, owner.enqueue, "q", {})
    sim.crash("a", at=5.0)
    sim.crash("b", at=5.0, restart_after=0.0)  # whichever got it dies mid-job
    result = sim.run(until=200.0)
    ev = result.events
    expired = ev[ev.kind == "lease_expired"]
    claimed = ev[ev.kind == "claimed"]
    assert len(expired) == 1
    first_claim = claimed.iloc[0]["t"]
    assert expired.iloc[0]["t"] == pytest.approx(first_claim + 30.0, abs=0.6)
    assert claimed.iloc[1]["attempt"] == 2 and seen[-1][1] == 2


def test_backoff_spacing_is_exact_in_virtual_time_and_dead_letter_follows():
    sim = Simulation(seed=3, latency_s=(0.0, 0.0))
    node = sim.node("solo")
    node.queue("q", max_attempts=4, retry_backoff_s=2.0, retry_backoff_max_s=5.0,
               retry_jitter=0.0)

    @node.worker("q")
    async def fail(job):
        raise RuntimeError("down")

    sim.at(0.0, node.enqueue, "q", {})
    result = sim.run(until=100.0)
    ev = result.events
    claims = list(ev[ev.kind == "claimed"]["t"])
    gaps = [round(b - a, 3) for a, b in zip(claims, claims[1:])]
    assert gaps == [2.0, 4.0, 5.0]  # 2, 4, then capped at 5
    assert list(ev[ev.kind == "dead_lettered"]["attempt"]) == [4]
    assert result.jobs.iloc[0]["state"] == "dead"
    assert result.check()["ok"].all()


def test_priority_then_fifo_in_simulation():
    sim = Simulation(seed=4)
    owner = sim.node("owner")
    owner.queue("q")
    order = []
    w = sim.node("w")

    @w.worker("q")
    async def work(job):
        order.append(job["n"])
        await asyncio.sleep(1)

    for n, prio in enumerate([0, 0, 9, 0, 9, 5]):
        sim.at(0.0, owner.enqueue, "q", {"n": n}, priority=prio)
    sim.crash("w", at=0.0, restart_after=1.0)  # start working after everything is queued
    result = sim.run(until=60.0)
    assert order == [2, 4, 5, 0, 1, 3]
    assert result.check()["ok"].all()


def test_worker_clock_skew_does_not_change_lease_deadlines_owner_skew_does_not_break_them():
    sim = Simulation(seed=5)
    owner = sim.node("owner", clock_skew_s=-3600.0, clock_drift_ppm=1000)
    owner.queue("q", lease_s=10.0)
    w = sim.node("w", clock_skew_s=500.0, clock_drift_ppm=-2000)

    @w.worker("q")
    async def slow(job):
        await asyncio.sleep(9.0)  # inside the lease by true time

    sim.enqueue_jobs("owner", "q", 5)
    result = sim.run(until=200.0)
    assert result.counts["duplicated"] == 0 and result.counts["ok"] == 5
    claimed = result.events[result.events.kind == "claimed"]
    # deadlines are on the owner's (skewed) clock
    assert (claimed["deadline"] - claimed["t_node"]).round(6).eq(10.0).all()
    assert result.check()["ok"].all()


def test_same_seed_gives_byte_identical_events_and_different_seed_differs():
    a = faulty_scenario(11).run(until=400.0).events.to_csv(index=False)
    b = faulty_scenario(11).run(until=400.0).events.to_csv(index=False)
    c = faulty_scenario(12).run(until=400.0).events.to_csv(index=False)
    assert a == b
    assert a != c


def test_determinism_across_processes():
    here = str(Path(__file__).parent)
    script = str(Path(here) / "procs" / "sim_digest.py")
    digests = set()
    for hashseed in ("1", "999"):
        out = subprocess.run([sys.executable, script, here, "11"], capture_output=True,
                             text=True, timeout=120, env={"PYTHONHASHSEED": hashseed,
                                                          "PATH": "/usr/bin:/bin",
                                                          # this checkout, not an installed copy
                                                          "PYTHONPATH": str(Path(here).parent)})
        assert out.returncode == 0, out.stderr
        digests.add(out.stdout.strip())
    local = hashlib.sha256(
        faulty_scenario(11).run(until=400.0).events.to_csv(index=False).encode()).hexdigest()
    assert digests == {local}


@pytest.mark.slow
@pytest.mark.parametrize("first", range(0, 200, 50))  # 200 seeds, in four parallel quarters
def test_200_random_seeds_with_faults_keep_every_invariant(first: int):
    failures = []
    totals = {"ok": 0, "duplicated": 0, "recovered": 0}
    for seed in range(first, first + 50):
        result = faulty_scenario(seed, jobs=16).run(until=250.0)
        report = result.check()
        if not report["ok"].all():
            failures.append((seed, report[~report["ok"]].to_dict("records")))
        for k in totals:
            totals[k] += result.counts[k]
    assert not failures, failures[:3]
    assert totals["ok"] > 50 * 10  # the runs did real work
    assert totals["duplicated"] > 0  # lost acks and crashes really happened


def test_lease_shorter_than_the_work_shows_up_as_duplicates():
    sim = Simulation(seed=8)
    owner = sim.node("owner")
    owner.queue("q", lease_s=2.0, max_attempts=10)
    for name in ("a", "b"):
        sim.node(name).worker("q", concurrency=2)(sim.handler(service_s=3.0))
    sim.enqueue_jobs("owner", "q", 10)
    result = sim.run(until=300.0)
    assert result.counts["duplicated"] > 0
    assert (result.jobs["deliveries"] > 1).any() and (result.jobs["effects"] > 1).any()
    assert result.check()["ok"].all()  # at-least-once holds; duplicates are the visible cost


def test_lost_acks_duplicate_side_effects_but_lose_nothing():
    sim = Simulation(seed=9)
    owner = sim.node("owner")
    owner.queue("q", lease_s=5.0)
    sim.node("w").worker("q", concurrency=4)(sim.handler(service_s=0.5))
    sim.lose_acks(0.3)
    sim.enqueue_jobs("owner", "q", 30, rate=2.0)
    result = sim.run(until=300.0)
    assert result.counts["lost"] == 0 and result.counts["ok"] == 30
    assert result.counts["duplicated"] > 0
    assert (result.events.kind == "ack_lost").sum() >= result.counts["duplicated"]


def test_volatile_owner_restart_loses_jobs_and_says_it_was_expected():
    sim = Simulation(seed=10)  # volatile storage
    owner = sim.node("owner")
    owner.queue("q")
    sim.enqueue_jobs("owner", "q", 5)  # no worker: they wait in the owner's memory
    sim.restart("owner", at=10.0)
    result = sim.run(until=20.0)
    assert result.counts["lost"] == 0 and result.counts["lost_expected"] == 5
    row = result.check().set_index("invariant").loc["no accepted job lost"]
    assert row["ok"] and "volatile" in row["detail"]


def test_durable_owner_restart_reloads_jobs():
    sim = Simulation(seed=10, storage="durable")
    owner = sim.node("owner")
    owner.queue("q")
    w = sim.node("w")
    w.worker("q")(sim.handler(service_s=0.1))
    sim.crash("w", at=0.0, restart_after=30.0)
    sim.enqueue_jobs("owner", "q", 5, start=1.0)
    sim.restart("owner", at=10.0)
    result = sim.run(until=60.0)
    assert result.counts["ok"] == 5 and result.counts["lost_expected"] == 0


def test_checker_catches_a_violation_in_a_doctored_record():
    result = contract_sim().run(until=600.0)
    claimed = next(e for e in result.events_raw if e["kind"] == "claimed")
    result.events_raw.insert(result.events_raw.index(claimed) + 1, dict(claimed, attempt=2))
    with pytest.raises(InvariantViolation, match="still leased"):
        result.check(strict=True)


def test_bad_scenario_input_names_the_problem():
    sim = Simulation(seed=1)
    sim.node("owner").queue("q")
    with pytest.raises(ScenarioError, match="unknown node 'ghost'"):
        sim.crash("ghost", at=1.0)
    with pytest.raises(ValueError, match="time must be a number >= 0"):
        sim.crash("owner", at=-1.0)
    with pytest.raises(ValueError, match="rate must be > 0"):
        sim.enqueue_jobs("owner", "q", 5, rate=-1.0)
    with pytest.raises(ValueError, match="loss"):
        sim.network(loss=1.5)
    sim.restart("owner", at=50.0)
    with pytest.raises(ValueError, match="ends before restart"):
        sim.run(until=10.0)
    with pytest.raises(ValueError, match="ha=True needs"):
        sim.node("x").queue("h", ha=True)


async def test_run_from_inside_a_running_loop_uses_a_thread():
    result = contract_sim().run(until=100.0)  # this test itself runs in an event loop
    assert result.counts["ok"] == 2
    again = await contract_sim().arun(until=100.0)
    assert again.events.to_csv() == result.events.to_csv()


def test_progress_reports_virtual_time():
    seen = []
    contract_sim().run(until=100.0, progress=lambda t, until: seen.append((t, until)))
    assert seen and seen[-1][0] <= 100.0 and len(seen) >= 90


def test_backoff_checker_uses_the_policy_band():
    lo, hi = delay_bounds(3, BackoffPolicy(1.0, 600.0, 0.1))
    assert (lo, hi) == pytest.approx((3.6, 4.4))


def test_ctrl_c_stops_a_run_cleanly_with_partial_results():
    def interrupt_at_half(t, until):
        if t >= until / 2:
            raise KeyboardInterrupt

    sim = Simulation(seed=2)
    sim.node("owner").queue("q")
    sim.node("w").worker("q")(sim.handler(service_s=1.0))
    sim.enqueue_jobs("owner", "q", 100, rate=1.0)
    result = sim.run(until=200.0, progress=interrupt_at_half)
    assert result.interrupted
    assert 90 <= result.virtual_s <= 110
    assert 80 <= result.counts["ok"] <= 100  # what finished before the stop is all there
    assert "[interrupted]" in result.summary()


def test_progress_other_than_a_callback_none_or_auto_is_a_scenario_error():
    sim = Simulation(seed=1)
    with pytest.raises(ScenarioError, match="progress"):
        sim.run(until=1.0, progress="bar")
    assert sim.run(until=1.0, progress="auto").jobs is not None  # "auto" still works
