"""The simulated half of `make demo`: an hour of a faulty mesh under virtual time.

One concept at two layers: ``make demo``'s simulated half here, its live half in
``istos/demo.py``.

The same engine as ``python -m istos.demo`` (the live half, on real Zenoh) runs 1,000 jobs
through worker crashes, an owner restart, lost acks, message loss and skewed clocks in a second
or two; the invariant checker then reports on the run. It lives on the notebook side because the
simulator and its report (a pandas frame) do; the engine never imports this package.
"""

from __future__ import annotations

from .sim import Simulation
from .views.run_report import report_lines


def simulated_hour() -> None:
    """Run the scenario and print its summary and the invariant report."""
    sim = Simulation(seed=7, storage="durable", latency_s=(0.001, 0.01), loss=0.01)
    owner = sim.node("owner", clock_skew_s=-3.0)
    owner.queue("jobs/email", lease_s=20, max_attempts=5, retry_backoff_s=1.0,
                keep_results=True)  # (done jobs keep their ctx.log lines for the check)
    for i in range(3):
        node = sim.node(f"worker-{i}", clock_skew_s=10.0 * i, clock_drift_ppm=200 * i)
        node.worker("jobs/email", concurrency=2)(
            sim.handler(service_s=("exp", 2.0), fail_p=0.1, crash_p=0.02, log_lines=2))
    sim.enqueue_jobs("owner", "jobs/email", 1000, rate=0.3, poisson=True)
    sim.crash_randomly(["worker-0", "worker-1", "worker-2"], mtbf_s=600, restart_after=30)
    sim.restart("owner", at=1800.0)
    sim.lose_acks(0.02)
    result = sim.run(until=3600.0, progress=None)
    print("simulated: " + result.summary())
    for line in report_lines(result):
        print("  " + line)


if __name__ == "__main__":
    simulated_hour()
