"""The simulator's outbox: application transactions write rows into an outbox database that
outlives every node, a relay node moves them into a queue, and the checker states "a job
exists iff its transaction committed; one job per row" under relay and owner crashes and an
outage of the outbox database."""

from __future__ import annotations

from istos_nb.sim import Simulation
from istos_nb.sim.checker_outbox import outbox_counts


def scenario(seed: int) -> Simulation:
    sim = Simulation(seed, storage="durable")
    sim.outbox.latency_s = 0.05  # a slow database: crashes land between accept and delete
    owner = sim.node("owner")
    owner.queue("q", lease_s=5, sweep_interval_s=0.5)
    owner.worker("q", concurrency=4, poll_interval_s=0.2)(sim.handler(service_s=("exp", 0.02)))
    relay = sim.node("relay")
    relay.outbox_relay(claim_s=2.0, poll_s=0.1, batch=20)
    sim.outbox_transactions("q", 300, rate=15, start=0.5, commit_p=0.7, rows=2)
    sim.crash_randomly(["relay"], mtbf_s=3.0, restart_after=0.5, start=1.0)
    sim.crash("owner", at=7.0, restart_after=2.0)
    sim.outbox_outage(at=12.0, until=13.5)
    return sim


def test_a_job_exists_iff_its_transaction_committed_once_per_row() -> None:
    sim = scenario(7)
    result = sim.run(60, progress=None)
    report = result.check(strict=True)  # every invariant, the outbox's among them
    assert "outbox: a job iff its transaction committed, one per row" in set(report.invariant)
    c = outbox_counts(sim.outbox.txns, result.events_raw, result.effects, set())
    assert c["rolled_back"] > 100 and c["committed"] > 300  # both sides were exercised
    assert c["jobs"] == c["committed"] and c["phantom"] == 0 and c["twice"] == 0
    crashes = [e for e in result.events_raw if e["kind"] == "crashed" and e["node"] == "relay"]
    assert len(crashes) >= 5  # the relay died mid-stream, many times
    resent = [e for e in result.events_raw if e["kind"] == "duplicate_enqueue"]
    assert resent  # some died after the owner accepted rows and before deleting them
    ran = {e["job_id"] for e in result.effects}
    assert ran == {t["job_id"] for t in sim.outbox.txns if t["committed"]}


def test_same_seed_same_run() -> None:
    a, b = scenario(3).run(30, progress=None), scenario(3).run(30, progress=None)
    assert a.events_raw == b.events_raw


def test_the_checker_sees_a_lost_a_phantom_and_a_doubled_row() -> None:
    txns = [{"job_id": "a", "queue": "q", "committed": True},
            {"job_id": "b", "queue": "q", "committed": False},
            {"job_id": "c", "queue": "q", "committed": True},
            {"job_id": "d", "queue": "q", "committed": True}]
    events = [{"job_id": j, "kind": "enqueued"} for j in ("b", "c", "c")]
    c = outbox_counts(txns, events, [], waiting={"d"})
    assert (c["lost"], c["phantom"], c["twice"], c["waiting"], c["jobs"]) == (1, 1, 1, 1, 1)
