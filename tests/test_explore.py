"""explore: a fault-schedule search that finds, shrinks, replays and explains a counterexample."""

from __future__ import annotations

import pytest

from istos.core.state import QueueState
from istos_nb.sim import Counterexample, NoCounterexample, ScenarioError, explore, find
from istos_nb.sim.explore import duplicated, run_schedule

LOST = "no accepted job lost"


def small_scenario(sim):
    """One owner, two workers, lease 5 s, default policy otherwise; twelve 1 s jobs at 1/s."""
    sim.node("owner").queue("q", lease_s=5.0)
    for name in ("wa", "wb"):
        sim.node(name).worker("q", concurrency=1, poll_interval_s=0.5)(
            sim.handler(service_s=1.0))
    sim.enqueue_jobs("owner", "q", 12, start=0.5, rate=1.0)


@pytest.fixture(scope="module")
def dup() -> Counterexample:
    found = explore(small_scenario, duplicated(), budget=60, until=30.0,
                    nodes=["wa", "wb"])
    assert isinstance(found, Counterexample), str(found)
    return found


def test_a_fault_free_run_runs_each_job_once():
    result = run_schedule(small_scenario, (), until=30.0)
    assert result.counts["ok"] == 12 and result.counts["duplicated"] == 0


def test_explore_finds_a_one_fault_duplicate_and_shrinks_it(dup):
    assert len(dup.schedule) == 1
    assert dup.result.counts["duplicated"] >= 1
    (fault,) = dup.schedule
    assert fault.node in ("wa", "wb")
    story = str(dup)
    assert "ran twice" in story and "t=" in story
    assert story.splitlines()[1].lstrip().startswith("1. t=")


def test_replay_reproduces_the_run_exactly(dup):
    again = dup.replay()
    assert again.events_raw == dup.result.events_raw
    assert again.effects == dup.result.effects


def test_to_test_compiles_and_passes(dup):
    src = dup.to_test()
    code = compile(src, "<generated>", "exec")
    scope: dict = {}
    exec(code, scope)
    tests = [v for k, v in scope.items() if k.startswith("test_") and callable(v)]
    assert len(tests) == 1
    tests[0]()


def test_chart_marks_the_faults_and_the_moment(dup):
    fig = dup.chart()
    ax = fig.axes[0]
    gids = {a.get_gid() for a in [*ax.patches, *ax.lines, *ax.collections]}
    assert {"fault", "violation", "leases"} <= gids


def test_a_property_that_holds_gives_coverage_not_a_proof():
    found = explore(small_scenario, LOST, budget=15, until=30.0, seed=1,
                    faults=["crash", "freeze", "partition", "storage_outage"],
                    options={"storage": "durable"})
    assert isinstance(found, NoCounterexample) and not found, str(found)
    text = str(found)
    assert text.startswith(f"'{LOST}': no counterexample in {found.schedules} schedules")
    assert "proof" in text and "proven" not in text
    assert found.schedules >= 15 and sum(found.coverage.faults.values()) > 0
    assert found.coverage.reached["a redelivery"] > 0


def test_a_planted_sweeper_bug_is_found(monkeypatch):
    """The sweeper forgets a job whose lease ran out instead of putting it back: a fault-free
    run never shows it (no lease runs out), one fault does."""
    original = QueueState._fail

    def forgetful(self, rec, now, outcome, *args, **kwargs):
        if outcome == "lease_expired":
            self._forget(rec, now)
            return None
        return original(self, rec, now, outcome, *args, **kwargs)

    monkeypatch.setattr(QueueState, "_fail", forgetful)
    assert run_schedule(small_scenario, (), until=30.0).counts["lost"] == 0
    found = explore(small_scenario, LOST, budget=60, until=30.0, nodes=["wa", "wb"])
    assert isinstance(found, Counterexample), str(found)
    assert len(found.schedule) == 1 and found.result.counts["lost"] >= 1
    assert "it is lost" in str(found)


def test_find_takes_a_predicate():
    found = explore(small_scenario, find(lambda r: r.counts["duplicated"] > 0, "a job ran twice"),
                    budget=60, until=30.0, nodes=["wa"], faults=["freeze"])
    assert found and len(found.schedule) == 1 and found.schedule[0].kind == "freeze"
    assert "lease runs out" in str(found)  # the freeze outlasted what was left of the lease


def test_bad_arguments_raise_scenario_errors():
    with pytest.raises(ScenarioError):
        explore(small_scenario, LOST, faults=["meteor"])
    with pytest.raises(ScenarioError):
        explore(small_scenario, LOST, faults=["storage_outage"])  # volatile storage
    with pytest.raises(ScenarioError):
        explore(small_scenario, LOST, nodes=["nobody"])
    with pytest.raises(ScenarioError, match="no invariant named"):
        explore(small_scenario, "no such invariant", budget=1, until=30.0)


SEARCH = """
import sys
sys.path.insert(0, {tests!r})
{extra}
from test_explore import small_scenario
from istos_nb.sim import explore
found = explore(small_scenario, "no accepted job lost", budget=8, until=30.0, nodes=["wa"])
print(found.coverage.schedules, sorted(found.coverage.faults.items()), str(found))
"""


def test_the_same_search_draws_the_same_schedules_whatever_was_imported(tmp_path):
    """Hypothesis mixes constants from the loaded modules' source into integer draws; the
    search does not draw integers, so a module full of other constants changes nothing."""
    import subprocess
    import sys
    from pathlib import Path

    tests = str(Path(__file__).parent)
    noise = tmp_path / "noise_constants.py"
    noise.write_text("VALUES = [" + ", ".join(str(i * 7) for i in range(200)) + "]\n")
    outputs = []
    for extra in ("", f"sys.path.insert(0, {str(tmp_path)!r}); import noise_constants"):
        run = subprocess.run([sys.executable, "-c", SEARCH.format(tests=tests, extra=extra)],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        outputs.append(run.stdout)
    assert outputs[0] == outputs[1] and outputs[0].startswith("9 ")
