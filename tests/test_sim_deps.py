"""Dependencies in the deterministic simulator (it runs the engine): children on one owner
node wait for parents on two other owner nodes, with failing attempts, owner restarts and a
partition, over 200 seeds; the checker proves "no child ran before its parents were done" and
"a child whose parents all finished done is not left waiting", and can fail."""

from __future__ import annotations

import pytest

from istos_nb.sim import Simulation

pytestmark = pytest.mark.fast  # virtual time: no process, server or session

MODES = ("cancel", "run", "wait")
RAN_AFTER = "no child ran before its parents were done"
NOT_LEFT = "a child whose parents all finished done is not left waiting"
# Every seed's last job event comes before t=50 (the faults end by t=16); the checker judges
# what came true at least SETTLE_S (70 s) before the end, so 130 s judges all of it. (The
# idle tail after the work is what costs CPU; a run cut too short would judge less, so keep
# UNTIL - SETTLE_S above the last event when changing the scenario.)
UNTIL = 130.0


def deps_sim(seed: int, *, ha: bool = False) -> Simulation:
    """``ha``: the children's and one parents' queue each on two replicas, their first leader
    crashed while children wait (a failover), instead of restarts and a partition."""
    sim = Simulation(seed=seed, storage="durable")
    ha_opts = {"ha": True, "ha_lease_s": 2.0} if ha else {}
    for name in ("na", "na2") if ha else ("na",):
        sim.node(name).queue("a", lease_s=4.0, max_attempts=2, retry_backoff_s=0.2,
                             keep_results=True, **ha_opts)
    sim.node("nb").queue("b", lease_s=4.0, max_attempts=2, retry_backoff_s=0.2, keep_results=True)
    for name in ("nc", "nc2") if ha else ("nc",):
        sim.node(name).queue("c", lease_s=4.0, max_attempts=3, retry_backoff_s=0.2, **ha_opts)
    sim.node("p")
    worker = sim.node("w")
    for q in ("a", "b"):
        worker.worker(q, concurrency=1, poll_interval_s=0.2)(
            sim.handler(service_s=("uniform", 0.5, 2.5), fail_p=0.15))
    worker.worker("c", concurrency=2, poll_interval_s=0.2)(sim.handler(service_s=0.1))
    sim.enqueue_jobs("p", "a", 20, rate=1.0, start=0.5)
    sim.enqueue_jobs("p", "b", 20, rate=1.0, start=0.7)
    sim.enqueue_children("p", "c", 24, parents_of=("a", "b"), fan_in=2, rate=1.2, start=1.0,
                         on_parent_failure=MODES[seed % 3])
    if ha:
        sim.crash("nc", at=6.0 + (seed % 5))  # whichever leads: the other takes over
        sim.crash("na", at=9.0 + (seed % 7) * 0.5)
        return sim
    sim.restart("nc", at=6.0 + (seed % 5))  # the children's owner, while children wait
    sim.restart("na", at=9.0 + (seed % 7) * 0.5)  # a parents' owner, with watches stored
    sim.partition({"na"}, {"nc"}, at=12.0, heal_at=16.0)  # reports across the cut wait
    return sim


@pytest.mark.fast(False)  # about a minute of CPU: the full run, not `make check`
@pytest.mark.parametrize("seeds", [range(0, 100), range(100, 200)])
def test_simulated_dependencies_hold_over_200_seeds_with_restarts_and_a_partition(seeds):
    for seed in seeds:
        _check_seed(seed)


def test_simulated_dependencies_hold_over_a_few_seeds():
    for seed in (0, 1, 2):  # one per on_parent_failure mode
        _check_seed(seed)


@pytest.mark.fast(False)
def test_simulated_dependencies_hold_across_ha_failovers_over_60_seeds():
    for seed in range(60):
        _check_seed(seed, ha=True)


def test_simulated_dependencies_hold_across_an_ha_failover():
    _check_seed(4, ha=True)


def _check_seed(seed: int, ha: bool = False) -> None:
    result = deps_sim(seed, ha=ha).run(until=UNTIL)
    report = result.check().set_index("invariant")
    assert report["ok"].all(), (seed, report[~report["ok"]])
    assert report.loc[RAN_AFTER, "detail"] == "ok", seed  # (there were children to check)
    assert result.counts["lost"] == 0 and result.counts["unexpected"] == 0, seed
    kinds = {e["kind"] for e in result.events_raw}
    assert {"waiting", "unblocked"} <= kinds, seed


def test_checker_catches_a_child_released_before_its_parents(monkeypatch):
    from istos.core import deps_rules

    monkeypatch.setattr(deps_rules, "verdict", lambda entry: "release")
    report = deps_sim(1).run(until=UNTIL).check().set_index("invariant")
    assert not report.loc[RAN_AFTER, "ok"]


def test_checker_catches_a_child_left_waiting(monkeypatch):
    from istos.owner.extensions import deps_ext

    async def never(self, rec, parent, outcome):  # every report and answer ignored
        return "repeat"

    monkeypatch.setattr(deps_ext.DepsOwner, "_count", never)
    report = deps_sim(2).run(until=UNTIL).check().set_index("invariant")
    assert not report.loc[NOT_LEFT, "ok"]
