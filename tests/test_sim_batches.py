"""The simulator's batch workload and the checker's batch invariants: batches with members on
three queues of three owner nodes, callbacks at an HA home, with owner restarts, an HA
failover, partitions and lost acks, over 200 seeds; and the invariants can fail (a record
that breaks them is caught)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from istos_nb.sim import Simulation
from istos_nb.sim.checker_batches import CALLBACKS_ONCE, COUNTS_KEPT, batch_findings
from istos_nb.sim.errors import ScenarioError
from istos_nb.views.run_report import report_lines

pytestmark = pytest.mark.fast  # virtual time: no process, server or session

# Every seed's last event comes before t=30 (the home's crash restarts by t=28); the checker
# requires what came due SETTLE_S (60 s) before the end, so 100 s requires all of it (and the
# sweep fails on an unsettled callback rather than judging less).
UNTIL = 100.0
MEMBERS = {"a": 4, "b": 4, "c": 4}


def scenario(seed: int) -> Simulation:
    """Three member queues (a, b, c) on three owners, the callbacks' queue ``cb`` led by h1 or
    h2 (HA); some members fail for good; one member owner restarts, the home's leader crashes
    (a failover) on even seeds or restarts on odd ones, a member owner is cut off from the
    home for a while, and acks get lost."""
    rng = random.Random(seed)
    sim = Simulation(seed=seed, storage="durable")
    for name in ("h1", "h2"):
        sim.node(name).queue("cb", lease_s=4.0, ha=True, ha_lease_s=2.0)
    for q in "abc":
        sim.node(f"m{q}").queue(q, lease_s=3.0, max_attempts=3, retry_backoff_s=0.2)
    sim.node("p")
    w = sim.node("w")
    w.worker("cb", poll_interval_s=0.2)(sim.handler(service_s=0.05))
    for q in "abc":
        w.worker(q, concurrency=3, poll_interval_s=0.2)(
            sim.handler(service_s=("uniform", 0.2, 1.5), fail_p=0.25 if seed % 3 == 0 else 0.05))
    sim.open_batches("p", 3, members=MEMBERS, callbacks="cb", start=1.0, every=1.5)
    t = rng.uniform(2.0, 6.0)
    sim.crash(f"m{rng.choice('abc')}", at=t, restart_after=rng.uniform(0.5, 4.0))
    home_at = rng.uniform(2.0, 8.0)
    if seed % 2 == 0:
        sim.crash("h1", at=home_at, restart_after=20.0)  # h2 takes over (an HA failover)
    else:
        sim.restart("h1", at=home_at)
    cut = rng.uniform(3.0, 10.0)
    sim.partition({f"m{rng.choice('abc')}"}, {"h1", "h2"}, at=cut, heal_at=cut + rng.uniform(1, 8))
    sim.lose_acks(0.1)
    return sim


def judged(seed: int) -> tuple[Any, dict[str, Any]]:
    result = scenario(seed).run(until=UNTIL, progress=None)
    report = result.check().set_index("invariant")
    return result, {name: report.loc[name] for name in (CALLBACKS_ONCE, COUNTS_KEPT)}


@pytest.mark.slow
@pytest.mark.fast(False)  # minutes of CPU: the full suite's, not `make check`'s
@pytest.mark.parametrize("first", range(0, 200, 25))  # 200 seeds, in eight parallel parts
def test_batch_invariants_hold_over_200_seeds_with_restarts_failovers_partitions(first: int):
    failures, fired, deaths = [], 0, 0
    for seed in range(first, first + 25):
        result, rows = judged(seed)
        report = result.check()
        if not report["ok"].all():
            failures.append((seed, report[~report["ok"]].to_dict("records")))
        assert "unsettled" not in rows[CALLBACKS_ONCE]["detail"], (seed, rows)
        kinds = [e["job_id"].rsplit(".", 1)[-1] for e in result.events_raw
                 if e["kind"] == "enqueued" and e["job_id"].startswith("wf:")]
        fired += len(kinds)
        deaths += kinds.count("on_death")
    assert not failures, failures[:3]
    assert fired >= 25 * 3 * 2  # every batch fired on_complete and one of the others
    assert deaths > 0  # some batches had a dead member (seeds divisible by 3 fail a lot)


@pytest.mark.parametrize("seed", range(6))
def test_a_few_seeds_quickly(seed: int):
    result, rows = judged(seed)
    assert all(row["ok"] for row in rows.values()), rows
    assert len(result.batches) == 3 and all(r["closed_at"] for r in result.batches)
    assert all(len(r["confirmed"]) == 12 for r in result.batches)
    kinds = {e["kind"] for e in result.events_raw}
    assert {"crashed", "partitioned", "owner_up"} <= kinds
    lines = report_lines(result)
    assert any("[ok]" in line and "batch callbacks" in line for line in lines), lines


def test_the_invariants_catch_a_callback_twice_and_a_lost_count():
    result, _ = judged(1)
    record = result._record()
    bid = result.batches[0]["batch_id"]
    fired = next(e for e in record.events if e["kind"] == "enqueued"
                 and e["job_id"] == f"{bid}.on_complete")
    record.events = [*record.events, dict(fired, t=fired["t"] + 1)]  # a second firing
    header = dict(record.batch_headers[bid])
    header["done"] -= 1  # a done count lost
    record.batch_headers = {**record.batch_headers, bid: header}
    once, counts = batch_findings(record)
    assert not once.ok and "on_complete enqueued 2 times" in once.detail
    assert not counts.ok and "done" in counts.detail


def test_a_callback_due_and_never_fired_fails():
    result, _ = judged(2)
    record = result._record()
    bid = result.batches[1]["batch_id"]
    record.events = [e for e in record.events if e["job_id"] != f"{bid}.on_complete"]
    once, _ = batch_findings(record)
    assert not once.ok and "on_complete due" in once.detail


def test_open_batches_needs_durable_storage_and_sane_counts():
    with pytest.raises(ScenarioError):
        Simulation(seed=1).open_batches("p", 1, members={"a": 1}, callbacks="cb")
    sim = Simulation(seed=1, storage="durable")
    sim.node("p")
    with pytest.raises(ScenarioError):
        sim.open_batches("p", 1, members={"a": -1}, callbacks="cb")
    with pytest.raises(ScenarioError):
        sim.open_batches("nobody", 1, members={"a": 1}, callbacks="cb")
