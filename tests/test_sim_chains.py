"""The simulator's chain workload and the checker's chain invariants: three-step chains over
three queues whose owners crash (from seed 100 on: HA pairs that fail over or restart, and the
worker cut off from one queue for a while), steps that fail for good, acks lost, over 200
seeds; and the invariants can fail (a record that breaks them is caught)."""

from __future__ import annotations

import copy
import random

import pytest

from istos_nb.sim import Simulation
from istos_nb.sim.checker_chains import AFTER_PREVIOUS, SUCCESSOR_MADE, chain_findings
from istos_nb.sim.errors import ScenarioError
from istos_nb.sim.run_record import RunRecord

pytestmark = pytest.mark.fast  # virtual time: no process, server or session

UNTIL = 100.0
QUEUES = ["a", "b", "c"]


def scenario(seed: int) -> Simulation:
    """Three chains over a -> b -> c; steps fail (for good after two tries) often on every
    third seed; each queue's owner crashes and restarts once (from seed 100 on each queue is
    an HA pair whose leader fails over on even seeds), the worker is cut off from b's owners
    a while (HA seeds), and acks get lost."""
    rng = random.Random(seed)
    sim = Simulation(seed=seed, storage="durable")
    ha = seed >= 100
    for q in QUEUES:
        for name in (f"{q}1", f"{q}2") if ha else (q,):
            sim.node(name).queue(q, lease_s=3.0, max_attempts=2, retry_backoff_s=0.2, ha=ha,
                                 ha_lease_s=2.0)
    sim.node("p")
    w = sim.node("w")
    for q in QUEUES:
        w.worker(q, concurrency=3, poll_interval_s=0.2)(sim.handler(
            service_s=("uniform", 0.2, 1.5), fail_p=0.3 if seed % 3 == 0 else 0.05))
    sim.open_chains("p", 3, queues=QUEUES, start=1.0, every=1.0)
    for q in QUEUES:
        leader = f"{q}1" if ha else q
        back = 20.0 if ha and seed % 2 == 0 else rng.uniform(0.5, 4.0)
        sim.crash(leader, at=rng.uniform(2.0, 8.0), restart_after=back)
    if ha:
        cut = rng.uniform(3.0, 10.0)
        sim.partition({"w"}, {"b1", "b2"}, at=cut, heal_at=cut + rng.uniform(1, 8))
    sim.lose_acks(0.1)
    return sim


@pytest.mark.slow
@pytest.mark.fast(False)  # a sweep: the full suite's, not `make check`'s
@pytest.mark.parametrize("first", range(0, 200, 50))  # 200 seeds, in four parallel parts
def test_chain_invariants_hold_over_200_seeds_with_crashes_failovers_and_deaths(first: int):
    failures, created, dead = [], 0, 0
    for seed in range(first, first + 50):
        result = scenario(seed).run(until=UNTIL, progress=None)
        report = result.check()
        if not report["ok"].all():
            failures.append((seed, report[~report["ok"]].to_dict("records")))
        created += sum(e["kind"] == "enqueued" and e["job_id"].startswith("wf:")
                       for e in result.events_raw)
        dead += sum(e["kind"] == "dead_lettered" for e in result.events_raw)
    assert not failures, failures[:3]
    assert created >= 50 * 3 * 2 and dead >= 5, (created, dead)  # chains ran, some broke


def test_open_chains_refuses_bad_arguments_naming_them():
    sim = Simulation(seed=1)
    sim.node("p")
    with pytest.raises(ScenarioError, match="queues"):
        sim.open_chains("p", 1, queues=[])
    with pytest.raises(ScenarioError, match="queues"):
        sim.open_chains("p", 1, queues="a")  # type: ignore[arg-type]
    with pytest.raises(ScenarioError, match="every"):
        sim.open_chains("p", 1, queues=["a"], every=0)
    with pytest.raises(ScenarioError, match="n must"):
        sim.open_chains("p", -1, queues=["a"])


def _record(seed: int) -> RunRecord:
    result = scenario(seed).run(until=UNTIL, progress=None)
    return result._record()  # noqa: SLF001 (the checker's input, to break on purpose)


def test_each_chain_invariant_catches_a_record_that_breaks_it():
    rec = _record(1)
    assert all(f.ok for f in chain_findings(rec)), chain_findings(rec)
    # a step created before the step before it succeeded
    early = copy.deepcopy(rec)
    step = next(e for e in early.events
                if e["kind"] == "enqueued" and e["job_id"].endswith(".1"))
    step["t"] = 0.0
    assert not {f.invariant: f for f in chain_findings(early)}[AFTER_PREVIOUS].ok
    # an acked step whose successor was never created
    missing = copy.deepcopy(rec)
    missing.events = [e for e in missing.events
                      if not (e["kind"] == "enqueued" and e["job_id"].endswith(".2"))]
    assert not {f.invariant: f for f in chain_findings(missing)}[SUCCESSOR_MADE].ok


def test_a_run_with_no_chain_says_so():
    sim = Simulation(seed=3)
    sim.node("o").queue("q")
    findings = chain_findings(sim.run(until=1.0, progress=None)._record())  # noqa: SLF001
    assert {f.detail for f in findings} == {"no chain in this run"}
