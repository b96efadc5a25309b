"""Events and the ledger inside the simulator: what notebook 02 teaches, checked."""

from __future__ import annotations

import pytest

from istos_nb.sim import Simulation

pytestmark = pytest.mark.fast  # `make check`: no process, server or session


def test_an_event_is_lost_on_a_crash_while_a_job_is_redelivered():
    sim = Simulation(seed=3)
    owner = sim.node("owner")
    owner.queue("jobs/email", lease_s=10.0)
    mailer = sim.node("mailer")
    got_events, got_jobs = [], []

    @mailer.subscribe("orders/created")
    async def on_order(data):
        got_events.append(data["order"])

    @mailer.worker("jobs/email")
    async def send(job):
        got_jobs.append(job["order"])

    sim.crash("mailer", at=5.0, restart_after=10.0)  # down from t=5 to t=15
    sim.at(8.0, owner.publish, "orders/created", {"order": 1})
    sim.at(8.0, owner.enqueue, "jobs/email", {"order": 1})
    sim.at(20.0, owner.publish, "orders/created", {"order": 2})
    result = sim.run(until=60.0)
    assert got_events == [2]  # the event published while it was down is gone
    assert got_jobs == [1]  # the job waited for it
    assert result.counts["ok"] == 1


def test_a_lost_ack_redelivers_but_the_ledger_skips_the_second_side_effect():
    sim = Simulation(seed=4, storage="durable")
    owner = sim.node("owner")
    owner.queue("jobs/charge", lease_s=5.0)
    worker = sim.node("worker")
    charges: list[int] = []

    @worker.worker("jobs/charge", concurrency=4)
    async def charge(job, ctx):
        async with worker.idempotent(f"charge:{job['order']}", ttl_s=3600) as first:
            if first:
                charges.append(job["order"])

    sim.lose_acks(0.5)
    sim.enqueue_jobs("owner", "jobs/charge", 20, rate=1.0, data=lambda i: {"order": i})
    result = sim.run(until=200.0)
    assert result.counts["duplicated"] > 0  # jobs really ran twice...
    assert sorted(charges) == list(range(20))  # ...but each charge happened once
    assert result.check()["ok"].all()
