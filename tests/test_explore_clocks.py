"""Clock faults (a node's wall clock jumps ahead; its clock runs fast for a while) and the
regressions explore found around leases: what the checker excuses, and what it must not.

The scenario is test_explore_ci's: two HA owners (lease 5 s), a plain worker ``wa`` and a
heart-beating worker ``wb``, 20 jobs. Leases are judged by the owner's clock, so a worker's clock
changes nothing, and an owner's clock that jumps ahead shortens the leases it holds (the
heartbeat invariant excuses that, and only that).
"""

from __future__ import annotations

from typing import Any

import pytest
from test_explore_ci import HEARTBEAT, OPTIONS, UNTIL, ha_scenario

from istos_nb.sim import explore
from istos_nb.sim.clock import SimClock
from istos_nb.sim.explore import FAULT_KINDS, Fault, run_schedule
from istos_nb.sim.result import SimResult

SINGLE_LEASE = "one live lease per job (by the owner's clock)"


class _Loop:
    def __init__(self) -> None:
        self.t = 0.0

    def time(self) -> float:
        return self.t


@pytest.mark.fast
def test_a_clock_steps_its_wall_time_only_and_bends_both_at_a_new_rate():
    loop = _Loop()
    clock = SimClock(loop, skew_s=1.0)  # type: ignore[arg-type]
    loop.t = 10.0
    assert (clock.now() - clock.epoch, clock.monotonic()) == (11.0, 10.0)
    clock.step(4.0)  # wall time jumps; monotonic time does not
    assert (clock.now() - clock.epoch, clock.monotonic()) == (15.0, 10.0)
    clock.set_rate(1.5)
    assert clock.monotonic() == 10.0  # continuous at the change
    loop.t = 12.0
    assert clock.monotonic() == pytest.approx(13.0)
    assert clock.true_time(clock.now()) == pytest.approx(12.0)
    assert clock.to_loop_seconds(3.0) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="rate"):
        clock.set_rate(0.0)


@pytest.mark.fast
def test_clock_faults_are_on_the_menu_and_tell_their_story():
    assert {"clock_skew", "clock_drift"} <= set(FAULT_KINDS)
    assert Fault("clock_skew", "o1", 3.0, 4.9).describe() == (
        "o1's clock jumps 4.9 s ahead", None)
    assert Fault("clock_drift", "wb", 2.0, 10.0, 0.5).describe()[0] == "wb's clock runs 50% fast"


def run(*faults: Fault, seed: int = 11) -> tuple[SimResult, Any]:
    result = run_schedule(ha_scenario, faults, seed=seed, until=UNTIL, options=OPTIONS)
    return result, result.check()


def expiries(result: SimResult, worker: str) -> list[dict[str, Any]]:
    return [e for e in result.events_raw
            if e["kind"] == "lease_expired" and str(e["worker"]).startswith(worker)]


def test_an_owner_clock_jumping_ahead_ends_heart_beaten_leases_early_and_is_excused():
    result, report = run(Fault("clock_skew", "o1", 3.0, 4.9))
    assert expiries(result, "wb"), "the jump shortened wb's leases by 4.9 s"
    assert report["ok"].all(), report[~report["ok"]]
    assert "explained" in report[report["invariant"] == HEARTBEAT]["detail"].iloc[0]


@pytest.mark.parametrize("fault", [Fault("clock_skew", "wb", 3.0, 12.0),
                                   Fault("clock_drift", "wb", 2.0, 16.0, 0.9),
                                   Fault("clock_drift", "o1", 2.0, 10.0, 0.9)],
                         ids=["worker-jumps", "worker-fast", "owner-fast"])
def test_clocks_that_leave_every_lease_its_time_change_nothing(fault: Fault):
    # A worker's clock is not consulted for leases; an owner running 90% fast still leaves a
    # 5 s lease 2.6 s, longer than wb's renewal period (lease_s / 3 on wb's clock).
    result, report = run(fault)
    assert report["ok"].all(), report[~report["ok"]]
    assert not expiries(result, "wb") and result.counts["duplicated"] == 0


def test_a_long_freeze_of_the_heart_beating_holder_is_excused():
    # explore: wb froze 4.9 s holding a job (lease 5 s); its renewals stopped with it.
    result, report = run(Fault("storage_outage", "", 0.1, 0.1), Fault("freeze", "wb", 1.6, 4.9),
                         seed=211)
    assert expiries(result, "wb")
    assert report["ok"].all(), report[~report["ok"]]


def test_a_failover_back_to_an_earlier_owner_starts_its_leases_afresh():
    # explore: o1 leased attempt 1, o2 (after an outage) expired it and leased attempt 2, o1
    # (after another) expired that and leased attempt 3: one live lease at every moment.
    result, report = run(Fault("storage_outage", "", 7.6, 8.2),
                         Fault("storage_outage", "", 22.4, 6.5), seed=202)
    assert [e["node"] for e in result.events_raw if e["kind"] == "owner_up"] == ["o1", "o2", "o1"]
    assert report[report["invariant"] == SINGLE_LEASE]["ok"].iloc[0], report


def test_a_claim_that_waited_for_a_new_owner_is_not_answered_after_it_gave_up():
    # explore: a parked claim sent while no owner served reached the new one with 0.09 s of its
    # budget left; the owner leased a job to it after the worker stopped listening.
    result, report = run(Fault("storage_outage", "", 15.7, 5.1), seed=0)
    assert report["ok"].all(), report[~report["ok"]]
    assert not expiries(result, "wb")


def test_explore_finds_nothing_with_worker_clock_faults():
    for invariant in (HEARTBEAT, SINGLE_LEASE):
        found = explore(ha_scenario, invariant, budget=12, seed=3, until=UNTIL, options=OPTIONS,
                        faults=["clock_skew", "clock_drift"], nodes=["wa", "wb"])
        assert not found, f"{found}\n{found.to_test()}"
