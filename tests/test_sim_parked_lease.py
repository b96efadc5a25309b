"""A parked claim's leases start when the owner hands the jobs out, not when the claim was sent.

An idle worker parks its claim at the owner for up to its poll interval. When a job arrives
after a park longer than the lease, the worker must still run it: its lease began at the hand-out
(the reply's ``waited_s`` says how long after the claim was sent), so counting it from the send
time would make the worker drop every such job unstarted and burn an attempt on it.
"""

from __future__ import annotations

import pytest

from istos.worker.worker import _waited
from istos_nb.sim import Simulation


@pytest.mark.fast
def test_waited_is_read_within_what_the_worker_asked_to_park():
    assert _waited({"parked": True, "waited_s": 2.0}, 5.0) == 2.0
    assert _waited({"parked": True, "waited_s": 99.0}, 5.0) == 5.0  # an owner's word, bounded
    assert _waited({"parked": True, "waited_s": -1.0}, 5.0) == 0.0
    assert _waited({"parked": True, "waited_s": float("nan")}, 5.0) == 0.0
    assert _waited({"parked": True, "waited_s": True}, 5.0) == 0.0
    assert _waited({"waited_s": 2.0}, 5.0) == 0.0  # not parked: no wait to count


def test_a_job_handed_to_a_claim_parked_longer_than_the_lease_runs_once():
    sim = Simulation(seed=3)
    sim.node("owner").queue("q", lease_s=0.5, max_attempts=3)
    sim.node("w").worker("q", concurrency=1, poll_interval_s=5.0)(sim.handler(service_s=0.1))
    sim.enqueue_jobs("owner", "q", 3, start=2.0, rate=0.5)  # each after a park of ~2 s
    result = sim.run(12.0, progress=None)
    assert result.check()["ok"].all()
    assert result.counts["ok"] == 3
    kinds = [e["kind"] for e in result.events_raw if e["job_id"]]
    assert "lease_expired" not in kinds
    assert [e["attempt"] for e in result.events_raw if e["kind"] == "claimed"] == [1, 1, 1]
