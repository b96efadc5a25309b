"""Simulator throughput: wall time of virtual runs (issue: 10k jobs, 8 slots, 5% crashing
deliveries, 1 virtual hour, under 10 s wall) and how wall time grows with the job count.

    python -m bench.sim [--runs 5] [--sizes 1000,10000,100000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from istos_nb.sim import Simulation


def scenario(jobs: int, seed: int, service_s: float) -> Simulation:
    sim = Simulation(seed=seed, storage="durable")
    owner = sim.node("owner")
    owner.queue("q", lease_s=30, max_attempts=5, retry_backoff_s=1.0)
    for i in range(2):
        w = sim.node(f"worker-{i}")
        w.worker("q", concurrency=4)(
            sim.handler(service_s=("exp", service_s), crash_p=0.05))
    sim.enqueue_jobs("owner", "q", jobs, rate=jobs / 3000.0, poisson=True)
    return sim


def run_once(jobs: int, seed: int, service_s: float) -> dict[str, float]:
    sim = scenario(jobs, seed, service_s)
    start = time.perf_counter()
    result = sim.run(until=3600.0)
    wall = time.perf_counter() - start
    counts = result.counts
    return {"wall_s": wall, "events": len(result.events_raw),
            "events_per_s": len(result.events_raw) / wall, "speedup": 3600.0 / wall,
            "ok": counts["ok"], "lost": counts["lost"], "duplicated": counts["duplicated"],
            "crashed_deliveries": sum(1 for e in result.events_raw
                                      if e["kind"] == "lease_expired")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--sizes", default="1000,10000,100000")
    args = parser.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    report = {}
    print(f"{'jobs':>8} {'wall s (median)':>16} {'events/s':>10} {'virtual/wall':>13} "
          f"{'wall/job us':>12} {'lost':>5}")
    for jobs in sizes:
        # Big runs take a while: fewer repetitions there, still a median.
        runs = args.runs if jobs <= 10_000 else max(1, min(args.runs, 3))
        service = 0.5 if jobs <= 10_000 else 0.05  # keep 8 slots able to keep up
        samples = [run_once(jobs, seed, service) for seed in range(runs)]
        wall = statistics.median(s["wall_s"] for s in samples)
        eps = statistics.median(s["events_per_s"] for s in samples)
        lost = max(s["lost"] for s in samples)
        report[jobs] = {"median_wall_s": wall, "median_events_per_s": eps,
                        "speedup": 3600.0 / wall, "runs": samples}
        print(f"{jobs:>8} {wall:>16.2f} {eps:>10.0f} {3600 / wall:>13.0f} "
              f"{wall / jobs * 1e6:>12.0f} {lost:>5}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    path = out / f"sim-{time.strftime('%Y%m%d')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
