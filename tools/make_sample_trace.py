"""Write ``notebooks/data/sample-trace.jsonl.gz``, the trace notebook 11 replays offline.

A *simulated* hour in the trace format ``istos record`` writes (``istos.tracefile``):
a report queue with a quiet background (0.08 jobs/s), a three-minute burst at 2.5 jobs/s from
minute 20, lognormal run times (median 3 s), 5% failing tries, two worker nodes of four slots,
and one of them crashing in the burst (minute 22) and coming back a minute later (the
simulator marks the crash in the stream, as a live recording cannot: see Trace.crashes).
Deterministic:

    PYTHONPATH=$PWD python tools/make_sample_trace.py
"""

from __future__ import annotations

import math
from pathlib import Path

from istos_nb.data.trace import Trace
from istos_nb.sim import Simulation

OUT = Path(__file__).resolve().parent.parent / "notebooks" / "data" / "sample-trace.jsonl.gz"
POLICY = {"lease_s": 30.0, "max_attempts": 4, "retry_backoff_s": 2.0,
          "retry_backoff_max_s": 60.0, "retry_jitter": 0.1}


def main() -> None:
    sim = Simulation(seed=2711)
    sim.node("owner").queue("reports", **POLICY)
    for name in ("worker-a", "worker-b"):
        sim.node(name).worker("reports", concurrency=4, prefetch=0)(
            sim.handler(service_s=("lognormal", math.log(3.0), 0.7), fail_p=0.05))
    sim.enqueue_jobs("owner", "reports", 290, rate=0.08, poisson=True, start=1.0)
    sim.enqueue_jobs("owner", "reports", 450, rate=2.5, poisson=True, start=1.0 + 20 * 60)
    sim.crash("worker-b", at=1.0 + 22 * 60, restart_after=60.0)
    result = sim.run(3700, progress=None)
    trace = Trace.from_events(result.job_events(), policy=POLICY, source="simulation")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    trace.save(OUT)
    print(f"{trace.summary()}\nwrote {OUT} ({OUT.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
