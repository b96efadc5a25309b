"""Scenarios shared by the simulator tests (and a subprocess that checks determinism)."""

from __future__ import annotations

import random

from istos_nb.sim import Simulation


def faulty_scenario(seed: int, *, jobs: int = 40, storage: str = "durable") -> Simulation:
    """Crashes, message loss, latency, skewed and drifting clocks, an owner restart."""
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
    return sim
