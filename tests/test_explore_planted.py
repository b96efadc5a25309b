"""A planted bug that 200 random seeds miss and explore finds, shrinks and tells as a story.

The bug (planted with ``monkeypatch`` inside these tests only; the engine is untouched): the
owner's sweeper, reclaiming an expired lease that overlapped a failed storage write (the branch
that hands the job back to ready without counting the attempt, ``QueueState._spare``), forgets
the job instead, in memory and in storage. A job is lost only when a worker dies holding it
*and* a storage write fails before its lease runs out: two faults, close together.

What each half shows:

* **The random test misses it.** The standard 200-seed random simulation (``test_sim.py``:
  ``faulty_scenario(seed, jobs=16)`` run to t=250 with worker crashes, an owner restart, a
  freeze, message loss, lost acks and a storage outage per seed; every checker invariant
  asserted) passes with the bug planted: it runs the same function, in four quarters of 50 seeds.
* **explore finds it.** ``explore(small_scenario, "no accepted job lost")`` on durable storage,
  drawing crashes, freezes and storage outages (at most 2 per schedule, budget 100, seed 0, 30 s
  runs) finds a loss and shrinks it to two faults: a worker crash holding a job and a short
  storage outage before the lease runs out. Without the bug, the same search (same budget and
  seed) finds nothing, and the counterexample's schedule replayed on the real engine loses nothing.
* **The minimal duplicate.** On the real engine, ``explore(small_scenario, duplicated())``
  (budget 60) finds a run where a job ran twice from a single fault.

Each search takes a few seconds of wall time (the simulator runs on virtual time); the 200 seeds
take about 15 s. ``pytest tests/test_explore_planted.py -s`` prints the stories.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import test_sim as random_sim
from test_explore import small_scenario

from istos.core.records import JobRecord
from istos.core.state import QueueState
from istos_nb.sim import Counterexample, NoCounterexample, explore
from istos_nb.sim.explore import duplicated, run_schedule

pytestmark = pytest.mark.slow

LOST = "no accepted job lost"
OPTIONS = {"storage": "durable"}
FAULTS = ["crash", "freeze", "storage_outage"]
SEARCH: dict[str, Any] = {"budget": 100, "seed": 0, "until": 30.0, "max_faults": 2,
                          "options": OPTIONS}


def _spare_forgets(self: QueueState, rec: JobRecord, now: float, outcome: str,
                   error: str) -> None:
    """The planted bug: drop the job whose lease overlapped a failed write, not re-queue it."""
    self._forget(rec, now)


@pytest.fixture
def planted(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(QueueState, "_spare", _spare_forgets)
    yield


@pytest.mark.parametrize("first", range(0, 200, 50))
def test_the_200_seed_random_simulation_misses_the_planted_bug(planted: None, first: int):
    random_sim.test_200_random_seeds_with_faults_keep_every_invariant(first)


def test_explore_finds_the_planted_loss_and_shrinks_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(QueueState, "_spare", _spare_forgets)
    calm = run_schedule(small_scenario, (), until=30.0, options=OPTIONS)
    assert calm.counts["lost"] == 0  # a fault-free run never shows it
    found = explore(small_scenario, LOST, faults=FAULTS, **SEARCH)
    print(found)
    assert isinstance(found, Counterexample), str(found)
    assert found.result.counts["lost"] >= 1 and "it is lost" in str(found)
    assert len(found.schedule) == 2
    assert {f.kind for f in found.schedule} == {"crash", "storage_outage"}
    assert found.replay().events_raw == found.result.events_raw
    monkeypatch.undo()  # the same schedule on the engine as it is: nothing lost
    again = run_schedule(small_scenario, found.schedule, until=30.0, options=OPTIONS)
    assert again.counts["lost"] == again.counts["stranded"] == 0
    assert again.check()["ok"].all()


def test_without_the_bug_the_same_search_finds_nothing():
    found = explore(small_scenario, LOST, faults=FAULTS, **SEARCH)
    print(found)
    assert isinstance(found, NoCounterexample) and not found, str(found)
    assert found.coverage.faults["storage_outage"] > 0 and found.coverage.faults["crash"] > 0


def test_explore_finds_a_one_fault_duplicate_on_the_real_engine():
    found = explore(small_scenario, duplicated(), budget=60, until=30.0, nodes=["wa", "wb"])
    print(found)
    assert isinstance(found, Counterexample), str(found)
    assert len(found.schedule) == 1 and found.result.counts["duplicated"] >= 1
