"""Scenarios shared by the simulator tests (and a subprocess that checks determinism)."""

from __future__ import annotations

import random

from istos_nb.sim import Simulation


def faulty_scenario(seed: int, *, jobs: int = 40, storage: str = "durable") -> Simulation:
    """Crashes, message loss, latency, skewed and drifting clocks, an owner restart, a frozen
    node (owner or worker, sometimes past the link lease) and, with durable storage, a storage
    outage."""
    pick = random.Random(seed)
    sim = Simulation(seed=seed, storage=storage, latency_s=(0.001, 0.02),
                     loss=pick.choice([0.0, 0.01, 0.05]))
    owner = sim.node("owner", clock_skew_s=pick.uniform(-5, 5),
                     clock_drift_ppm=pick.uniform(-200, 200))
    owner.queue("q", lease_s=5.0, max_attempts=4, retry_backoff_s=0.5,
                retry_backoff_max_s=4.0, retry_jitter=0.2)
    workers = []
    for i in range(3):
        name = f"w{i}"
        w = sim.node(name, clock_skew_s=pick.uniform(-30, 30),
                     clock_drift_ppm=pick.uniform(-500, 500))
        w.worker("q", concurrency=2, poll_interval_s=1.0)(
            sim.handler(service_s=("uniform", 0.1, 2.0), fail_p=0.2, crash_p=0.03))
        workers.append(name)
    sim.enqueue_jobs("owner", "q", jobs, rate=1.0, poisson=True,
                     data=lambda i: {"i": i}, priority=0)
    sim.enqueue_jobs("owner", "q", jobs // 4, rate=0.5, start=3.0,
                     data=lambda i: {"urgent": i}, priority=5)
    sim.crash_randomly(workers, mtbf_s=120.0, restart_after=10.0)
    sim.restart("owner", at=pick.uniform(20, 60))
    sim.lose_acks(0.02)
    frozen_at = pick.uniform(30, 120)
    sim.freeze(pick.choice(["owner", *workers]), at=frozen_at,
               resume_at=frozen_at + pick.uniform(1, 20))
    if storage == "durable":
        down_at = pick.uniform(30, 150)
        sim.storage_outage(at=down_at, until=down_at + pick.uniform(1, 15))
    return sim


def faulty_ha_scenario(seed: int, *, jobs: int = 30) -> Simulation:
    """Two HA replicas on durable storage: the leader frozen (often past the link lease), a
    storage outage, replica and worker crashes, message loss, skewed clocks."""
    pick = random.Random(seed)
    sim = Simulation(seed=seed, storage="durable", latency_s=(0.001, 0.02),
                     loss=pick.choice([0.0, 0.01]), link_lease_s=10.0)
    for name in ("a", "b"):
        sim.node(name, clock_skew_s=pick.uniform(-0.2, 0.2)).queue(
            "q", ha=True, ha_lease_s=3.0, lease_s=5.0, max_attempts=4, retry_backoff_s=0.5)
    workers = []
    for i in range(2):
        name = f"w{i}"
        sim.node(name, clock_skew_s=pick.uniform(-30, 30)).worker(
            "q", concurrency=2, poll_interval_s=1.0)(
            sim.handler(service_s=("uniform", 0.1, 2.0), fail_p=0.1, crash_p=0.02))
        workers.append(name)
    sim.node("p")
    sim.enqueue_jobs("p", "q", jobs, rate=0.5, poisson=True, data=lambda i: {"i": i})
    frozen_at = pick.uniform(10, 60)
    sim.freeze("a", at=frozen_at, resume_at=frozen_at + pick.uniform(2, 25))
    down_at = pick.uniform(20, 90)
    sim.storage_outage(at=down_at, until=down_at + pick.uniform(1, 10))
    sim.crash_randomly(workers, mtbf_s=120.0, restart_after=10.0)
    sim.crash("b", at=pick.uniform(60, 120), restart_after=pick.uniform(0, 5))
    return sim
