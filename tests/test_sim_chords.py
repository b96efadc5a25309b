"""The simulator's chord workload and the checker's chord invariants: chords whose members
fail for good or are cancelled, with the member queue's owner and the callback queue's owner
crashing, failing over and cut apart, and acks lost, over 200 seeds; and the invariants can
fail (a record that breaks them is caught).

The sweep found a chord that never fired: the member whose ack completed the barrier had that
ack refused (the callback's queue was down) and ran out of attempts before it came back. The
member queue's owner now fires a complete barrier itself once such a member has ended."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from istos_nb.sim import Simulation
from istos_nb.sim.checker_chords import (
    AFTER_MEMBERS,
    FIRES_WHEN_DONE,
    STALL_SAID,
    chord_findings,
)
from istos_nb.sim.errors import ScenarioError
from istos_nb.sim.run_record import RunRecord

pytestmark = pytest.mark.fast  # virtual time: no process, server or session

# Every seed's faults end by t=28 and its chords open by t=4; the stall check requires what
# ended SETTLE_S (60 s) before the end, so 100 s requires all of it.
UNTIL = 100.0


def scenario(seed: int) -> Simulation:
    """Three chords of four members on ``shard``, callbacks on ``reduce``; members fail (for
    good after two tries) often on every third seed, odd seeds cancel each chord's last
    member, and acks get lost. Seeds below 100: one owner per queue (m, c), each crashing and
    restarting once. From 100 on: each queue led by one of two HA replicas, the member
    queue's leader crashed (a failover) on even seeds or restarted on odd ones, the
    callbacks' leader crashed and restarted, and the two sides cut apart for a while."""
    rng = random.Random(seed)
    sim = Simulation(seed=seed, storage="durable")
    ha = seed >= 100
    for name in ("m1", "m2") if ha else ("m",):
        sim.node(name).queue("shard", lease_s=3.0, max_attempts=2, retry_backoff_s=0.2,
                             admin=True, ha=ha, ha_lease_s=2.0)
    for name in ("c1", "c2") if ha else ("c",):
        sim.node(name).queue("reduce", lease_s=3.0, ha=ha, ha_lease_s=2.0)
    sim.node("p")
    w = sim.node("w")
    w.worker("shard", concurrency=3, poll_interval_s=0.2)(
        sim.handler(service_s=("uniform", 0.2, 1.5), fail_p=0.3 if seed % 3 == 0 else 0.05))
    w.worker("reduce", poll_interval_s=0.2)(sim.handler(service_s=0.05))
    sim.open_chords("p", 3, queue="shard", size=4, callback="reduce",
                    cancel=1 if seed % 2 else 0, start=1.0, every=1.5)
    member, callbacks = ("m1", "c1") if ha else ("m", "c")
    if ha and seed % 2 == 0:
        sim.crash(member, at=rng.uniform(2.0, 8.0), restart_after=20.0)  # m2 takes over
    elif ha:
        sim.restart(member, at=rng.uniform(2.0, 8.0))
    else:
        sim.crash(member, at=rng.uniform(2.0, 8.0), restart_after=rng.uniform(0.5, 4.0))
    sim.crash(callbacks, at=rng.uniform(2.0, 8.0), restart_after=rng.uniform(0.5, 4.0))
    if ha:
        cut = rng.uniform(3.0, 10.0)
        sim.partition({"m1", "m2"}, {"c1", "c2"}, at=cut, heal_at=cut + rng.uniform(1, 8))
    sim.lose_acks(0.1)
    return sim


@pytest.mark.slow
@pytest.mark.fast(False)  # a sweep: the full suite's, not `make check`'s
@pytest.mark.parametrize("first", range(0, 200, 50))  # 200 seeds, in four parallel parts
def test_chord_invariants_hold_over_200_seeds_with_crashes_deaths_and_cancels(first: int):
    failures, fired, stalls, cancelled = [], 0, 0, 0
    for seed in range(first, first + 50):
        result = scenario(seed).run(until=UNTIL, progress=None)
        report = result.check()
        if not report["ok"].all():
            failures.append((seed, report[~report["ok"]].to_dict("records")))
        mine = report.set_index("invariant").loc[[AFTER_MEMBERS, FIRES_WHEN_DONE, STALL_SAID]]
        assert not mine["detail"].str.contains("unsettled").any(), (seed, mine.to_dict())
        fired += sum(e["kind"] == "enqueued" and e["job_id"].endswith(".callback")
                     for e in result.events_raw)
        stalls += sum(e["kind"] == "chord" for e in result.events_raw)
        cancelled += sum(e["kind"] == "cancelled" for e in result.events_raw)
    assert not failures, failures[:3]
    # the sweep covers what it is about: callbacks fired, stalls said, members cancelled
    assert fired >= 40 and stalls >= 40 and cancelled >= 25, (fired, stalls, cancelled)


def test_open_chords_refuses_bad_arguments_naming_them():
    sim = Simulation(seed=1)
    sim.node("p")
    for kwargs, field in (({"size": 0}, "size"), ({"size": 4, "cancel": 5}, "cancel"),
                          ({"size": 4, "every": 0}, "every")):
        with pytest.raises(ScenarioError, match=field):
            sim.open_chords("p", 1, queue="q", callback="cb", **kwargs)
    with pytest.raises(ScenarioError, match="n must"):
        sim.open_chords("p", -1, queue="q", size=2, callback="cb")
    with pytest.raises(ScenarioError):
        sim.open_chords("nobody", 1, queue="q", size=2, callback="cb")


def _record(seed: int) -> RunRecord:
    result = scenario(seed).run(until=UNTIL, progress=None)
    return result._record()  # noqa: SLF001 (the checker's input, to break on purpose)


def _judge(rec: RunRecord) -> dict[str, Any]:
    return {f.invariant: f for f in chord_findings(rec)}


def test_each_chord_invariant_catches_a_record_that_breaks_it():
    # seed 0: every chord fired; seed 1: each chord's last member cancelled (stalled, said)
    fired, stalled = _record(0), _record(1)
    assert all(f.ok for f in chord_findings(fired)), chord_findings(fired)
    assert all(f.ok for f in chord_findings(stalled)), chord_findings(stalled)
    # a callback created before a member's handler returned
    early = copy.deepcopy(fired)
    first_cb = next(e for e in early.events
                    if e["kind"] == "enqueued" and e["job_id"].endswith(".callback"))
    first_cb["t"] = 0.0
    assert not _judge(early)[AFTER_MEMBERS].ok
    # every member acked and no callback created
    unfired = copy.deepcopy(fired)
    unfired.events = [e for e in unfired.events if not (
        e["kind"] == "enqueued" and e["job_id"].endswith(".callback"))]
    assert not _judge(unfired)[FIRES_WHEN_DONE].ok
    # a cancelled member with no stall said
    unsaid = copy.deepcopy(stalled)
    unsaid.events = [e for e in unsaid.events if e["kind"] != "chord"]
    finding = _judge(unsaid)[STALL_SAID]
    assert not finding.ok and "cancelled" in finding.detail
    # ... but one that ended in the run's last minute is only counted unsettled
    unsaid.end_t = max(e["t"] for e in unsaid.events if e["kind"] == "cancelled") + 1.0
    finding = _judge(unsaid)[STALL_SAID]
    assert finding.ok and "unsettled" in finding.detail


def test_a_run_with_no_chord_says_so():
    sim = Simulation(seed=3)
    sim.node("o").queue("q")
    assert {f.detail for f in chord_findings(sim.run(until=1.0, progress=None)._record())} \
        == {"no chord in this run"}  # noqa: SLF001
