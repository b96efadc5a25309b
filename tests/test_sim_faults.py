"""The simulator's freeze/resume and shared-storage outage faults, and the stranded check."""

from __future__ import annotations

import pytest
from sim_scenarios import faulty_ha_scenario

from istos_nb.sim import InvariantViolation, ScenarioError, Simulation


def kinds(result, kind: str, node: str | None = None) -> list[dict]:
    return [e for e in result.events_raw
            if e["kind"] == kind and (node is None or e["node"] == node)]


def ha_sim(seed: int) -> Simulation:
    sim = Simulation(seed=seed, storage="durable", link_lease_s=10.0)
    for name in ("a", "b"):
        sim.node(name).queue("q", ha=True, ha_lease_s=3.0, lease_s=5.0, max_attempts=3)
    for name in ("w1", "w2"):
        sim.node(name).worker("q", concurrency=2, poll_interval_s=0.5)(
            sim.handler(service_s=("uniform", 0.1, 1.0)))
    sim.node("p")
    return sim


def test_frozen_ha_leader_is_replaced_and_harmless_when_it_resumes():
    sim = ha_sim(1)
    sim.enqueue_jobs("p", "q", 30, start=1.0, rate=2.0)
    sim.freeze("a", at=30.0, resume_at=60.0)  # longer than the link lease (10 s)
    sim.enqueue_jobs("p", "q", 60, start=32.0, rate=3.0)
    result = sim.run(until=150.0)
    report = result.check()
    assert report["ok"].all(), report[~report["ok"]]
    c = result.counts
    # Enqueues sent while nobody led time out (the producer sees the error; not accepted).
    assert c["accepted"] >= 80 and c["ok"] == c["accepted"]
    assert c["lost"] == 0 and c["stranded"] == 0
    (frozen,) = kinds(result, "frozen", "a")
    took_over = [e for e in kinds(result, "owner_up", "b") if e["t"] > frozen["t"]]
    assert took_over, "the standby never took over"
    # Bounded by the storage lease (3 s) plus a renewal interval, not the 10 s link lease.
    assert took_over[0]["t"] - frozen["t"] < 3.0 + 1.0 + 0.5
    # After resuming, the old leader leased nothing from its stale memory.
    (resumed,) = kinds(result, "resumed", "a")
    assert not [e for e in kinds(result, "claimed", "a") if e["t"] >= resumed["t"]]


def test_frozen_worker_comes_back_late_and_nothing_is_lost():
    sim = ha_sim(2)
    sim.enqueue_jobs("p", "q", 40, start=1.0, rate=4.0)
    sim.freeze("w1", at=3.0, resume_at=25.0)
    result = sim.run(until=120.0)
    report = result.check()
    assert report["ok"].all(), report[~report["ok"]]
    assert result.counts["ok"] == 40 and result.counts["stranded"] == 0
    assert kinds(result, "lease_expired")  # the frozen worker's leases ran out meanwhile


def test_storage_outage_burns_no_attempt():
    sim = Simulation(seed=3, storage="durable")
    sim.node("owner").queue("q", lease_s=4.0, max_attempts=1, retry_backoff_s=0.1)
    sim.node("w").worker("q", concurrency=4, poll_interval_s=0.2)(
        sim.handler(service_s=("uniform", 1.0, 3.0)))
    sim.enqueue_jobs("owner", "q", 20, start=0.0)  # all accepted before the outage
    sim.storage_outage(at=4.0, until=19.0)  # 15 s, many leases long, while the worker polls
    result = sim.run(until=80.0)
    report = result.check()
    assert report["ok"].all(), report[~report["ok"]]
    assert result.counts["accepted"] == 20 and result.counts["ok"] == 20
    assert not kinds(result, "dead_lettered")
    assert kinds(result, "lease_expired")  # leases ran out across the outage, uncounted
    assert kinds(result, "storage_down") and kinds(result, "storage_up")


def test_checker_reports_stranded_jobs():
    sim = Simulation(seed=4, storage="durable")
    sim.node("owner").queue("q")
    sim.node("w").worker("q")(sim.handler(service_s=0.1))
    sim.enqueue_jobs("owner", "q", 3, start=0.0)
    result = sim.run(until=20.0)
    assert result.counts["stranded"] == 0
    victim = result.effects[0]["job_id"]
    result.effects[:] = [e for e in result.effects if e["job_id"] != victim]
    result.stored.add(victim)  # still in storage, processed by nobody, held by nobody
    with pytest.raises(InvariantViolation, match="stranded"):
        result.check(strict=True)


def test_fault_input_errors_name_the_problem():
    sim = Simulation(seed=5)
    sim.node("n")
    with pytest.raises(ScenarioError, match="durable"):
        sim.storage_outage(at=1.0, until=2.0)
    with pytest.raises(ScenarioError, match="resume_at"):
        sim.freeze("n", at=5.0, resume_at=1.0)
    with pytest.raises(ScenarioError, match="unknown node"):
        sim.freeze("nope", at=1.0)
    with pytest.raises(ScenarioError, match="link_lease_s"):
        Simulation(link_lease_s=0)


@pytest.mark.slow
@pytest.mark.parametrize("first", [0, 25])  # 50 seeds, in two parallel halves
def test_50_random_seeds_of_ha_failover_with_freezes_and_outages_keep_every_invariant(
        first: int):
    failures, ok = [], 0
    for seed in range(first, first + 25):
        result = faulty_ha_scenario(seed).run(until=300.0)
        report = result.check()
        if not report["ok"].all():
            failures.append((seed, report[~report["ok"]].to_dict("records")))
        ok += result.counts["ok"]
    assert not failures, failures[:3]
    assert ok > 25 * 20  # the runs did real work
