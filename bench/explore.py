"""How fast ``istos_nb.sim.explore`` searches: schedules per second, and how that falls with size.

    python -m bench.explore                      # the small scenario, 3 searches, medians
    python -m bench.explore --jobs 12,48,192     # also how it scales with the job count

The scenario is the one of ``tests/test_explore.py`` (one owner, two workers, a 5 s lease,
one-second jobs at one a second, 30 virtual s) with ``--jobs`` jobs and a run long enough to
hold them. The property always holds, so every search runs its whole ``--budget`` of schedules
over the full fault menu (no shrinking): the figure is schedules per wall second, with the CPU
seconds of the process beside it (other processes inflate those far less on a shared machine).
Raw runs go to ``bench/results/explore-<date>.json`` (gitignored).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from istos_nb.sim import Simulation, explore


def scenario(jobs: int) -> Callable[[Simulation], None]:
    def build(sim: Simulation) -> None:
        sim.node("owner").queue("q", lease_s=5.0)
        for name in ("wa", "wb"):
            sim.node(name).worker("q", concurrency=1, poll_interval_s=0.5)(
                sim.handler(service_s=1.0))
        sim.enqueue_jobs("owner", "q", jobs, start=0.5, rate=1.0)

    return build


def search_once(jobs: int, budget: int, seed: int) -> dict[str, float]:
    until = max(30.0, jobs * 1.0 + 15.0)
    wall, cpu = time.perf_counter(), time.process_time()
    found = explore(scenario(jobs), lambda r: True, budget=budget, seed=seed, until=until)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    n = found.coverage.schedules
    return {"schedules": n, "wall_s": wall, "cpu_s": cpu, "per_s": n / wall,
            "per_cpu_s": n / cpu}


def measure(jobs: int, runs: int, budget: int) -> dict[str, Any]:
    samples = [search_once(jobs, budget, seed) for seed in range(runs)]
    med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    print(f"{jobs:>5} jobs: {med['per_s']:7.1f} schedules/s "
          f"({med['per_cpu_s']:.1f} per CPU s; {med['schedules']:.0f} schedules in "
          f"{med['wall_s']:.2f} s, median of {runs})")
    return {"jobs": jobs, "median": med, "samples": samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--budget", type=int, default=100)
    parser.add_argument("--jobs", default="12", help="comma-separated job counts")
    args = parser.parse_args()
    report: dict[str, Any] = {"load_before": os.getloadavg(), "budget": args.budget}
    report["sizes"] = [measure(int(j), args.runs, args.budget)
                       for j in args.jobs.split(",") if j]
    report["load_after"] = os.getloadavg()
    print(f"load average before {report['load_before'][0]:.1f}, "
          f"after {report['load_after'][0]:.1f} (2 cores)")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    path = out / f"explore-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
