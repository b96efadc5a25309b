"""Simulator speed where users feel it (issue 18), and how wall time grows with the job count.

    python -m bench.sim                       # the three targets, 5 runs each, medians
    python -m bench.sim --runs 3 --only 10k
    python -m bench.sim --sizes 1000,10000,100000   # also the growth sweep
    python -m bench.sim --profile dashboard   # cProfile one run of a target instead

Targets (wall time of ``Simulation.run``, medians of ``--runs``):

* ``dashboard``: the SimDashboard's default scenario (200 jobs, 3 workers x 2 slots, worker
  crashes, skewed clocks): <= 0.3 s. Also timed: the whole ``SimDashboard.run()`` (charts, jobs
  table and invariant check included), when ipywidgets is installed.
* ``1k``: the same scenario with 1,000 jobs: <= 0.5 s.
* ``10k``: 10,000 Poisson arrivals over ~3,000 virtual s, 2 workers x 4 slots, 5% crashing
  deliveries, durable storage, run to 1 virtual hour: <= 3 s.

Wall time on a shared 2-core machine moves with the load, so every line also gives the median
CPU time of the process (``time.process_time()``), which other processes inflate far less.
Raw runs go to ``bench/results/sim-<date>.json`` (gitignored).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from istos_nb.sim import Simulation
from istos_nb.views.scenario import scenario_from_params

TARGETS_S = {"dashboard": 0.3, "1k": 0.5, "10k": 3.0}


def scenario(jobs: int, seed: int, service_s: float) -> Simulation:
    """The ``10k`` shape for any job count: arrivals spread over 3,000 virtual seconds."""
    sim = Simulation(seed=seed, storage="durable")
    owner = sim.node("owner")
    owner.queue("q", lease_s=30, max_attempts=5, retry_backoff_s=1.0)
    for i in range(2):
        w = sim.node(f"worker-{i}")
        w.worker("q", concurrency=4)(
            sim.handler(service_s=("exp", service_s), crash_p=0.05))
    sim.enqueue_jobs("owner", "q", jobs, rate=jobs / 3000.0, poisson=True)
    return sim


def build(target: str, seed: int) -> tuple[Simulation, float]:
    """(simulation, until) for a named target; the seed varies between runs."""
    if target == "dashboard":
        return scenario_from_params({"seed": seed})
    if target == "1k":
        return scenario_from_params({"seed": seed, "jobs": 1000})
    if target == "10k":
        return scenario(10_000, seed, 0.5), 3600.0
    raise SystemExit(f"unknown target {target!r}; known: {sorted(TARGETS_S)}")


def timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """fn's result, wall seconds and CPU seconds of this process."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall0, time.process_time() - cpu0


def run_once(target: str, seed: int) -> dict[str, float]:
    sim, until = build(target, seed)
    result, wall, cpu = timed(lambda: sim.run(until, progress=None))
    counts = result.counts
    return {"wall_s": wall, "cpu_s": cpu, "events": len(result.events_raw),
            "virtual_s": result.virtual_s, "ok": counts["ok"], "lost": counts["lost"],
            "duplicated": counts["duplicated"],
            "crashed_deliveries": sum(1 for e in result.events_raw
                                      if e["kind"] == "lease_expired")}


def dashboard_once(seed: int) -> dict[str, float] | None:
    """The whole SimDashboard.run(): simulation, charts, jobs table, invariant check."""
    try:
        from istos_nb.views.widgets import SimDashboard
    except ImportError:  # ipywidgets is the notebook extra
        return None
    board = SimDashboard({"seed": seed})
    _, wall, cpu = timed(board.run)
    return {"wall_s": wall, "cpu_s": cpu}


def median_of(samples: list[dict[str, float]], key: str) -> float:
    return statistics.median(s[key] for s in samples)


def row(label: str, samples: list[dict[str, float]], target: float | None) -> str:
    wall, cpu = median_of(samples, "wall_s"), median_of(samples, "cpu_s")
    verdict = "" if target is None else ("yes" if wall <= target else "NO")
    cpu_verdict = "" if target is None else ("yes" if cpu <= target else "NO")
    events = f"{median_of(samples, 'events'):>8.0f}" if "events" in samples[0] else f"{'':>8}"
    return (f"{label:<34} {events} {wall:>8.3f} {cpu:>8.3f} "
            f"{'' if target is None else f'{target:g}':>7} {verdict:>6} {cpu_verdict:>6}")


def targets(names: list[str], runs: int, report: dict[str, Any]) -> None:
    print(f"{'run (medians of ' + str(runs) + ')':<34} {'events':>8} {'wall s':>8} "
          f"{'cpu s':>8} {'target':>7} {'wall':>6} {'cpu':>6}")
    for name in names:
        samples = [run_once(name, seed) for seed in range(1, runs + 1)]
        report[name] = {"target_s": TARGETS_S[name], "median_wall_s": median_of(samples, "wall_s"),
                        "median_cpu_s": median_of(samples, "cpu_s"), "runs": samples}
        print(row(f"{name}: Simulation.run", samples, TARGETS_S[name]))
        lost = max(s["lost"] for s in samples)
        if lost:
            print(f"  !! {lost} jobs lost")
        if name == "dashboard":
            boards = [b for seed in range(1, runs + 1) if (b := dashboard_once(seed))]
            if boards:
                report["dashboard_full"] = {"median_wall_s": median_of(boards, "wall_s"),
                                            "median_cpu_s": median_of(boards, "cpu_s"),
                                            "runs": boards}
                print(row("dashboard: SimDashboard.run()", boards, None))


def sweep(sizes: list[int], runs: int, report: dict[str, Any]) -> None:
    print(f"\n{'jobs':>8} {'wall s':>8} {'cpu s':>8} {'events/cpu s':>13} {'virtual/wall':>13} "
          f"{'cpu us/job':>11} {'lost':>5}")
    for jobs in sizes:
        # Big runs take a while: fewer repetitions there, still a median.
        n = runs if jobs <= 10_000 else max(1, min(runs, 3))
        service = 0.5 if jobs <= 10_000 else 0.05  # keep 8 slots able to keep up
        samples = []
        for seed in range(n):
            sim = scenario(jobs, seed, service)
            result, wall, cpu = timed(lambda sim=sim: sim.run(3600.0, progress=None))
            samples.append({"wall_s": wall, "cpu_s": cpu, "events": len(result.events_raw),
                            "lost": result.counts["lost"]})
        wall, cpu = median_of(samples, "wall_s"), median_of(samples, "cpu_s")
        events = median_of(samples, "events")
        report[f"sweep_{jobs}"] = {"median_wall_s": wall, "median_cpu_s": cpu, "runs": samples}
        print(f"{jobs:>8} {wall:>8.2f} {cpu:>8.2f} {events / cpu:>13.0f} {3600 / wall:>13.0f} "
              f"{cpu / jobs * 1e6:>11.0f} {max(s['lost'] for s in samples):>5}")


def profile(target: str) -> None:
    sim, until = build(target, 1)
    prof = cProfile.Profile()
    prof.runcall(sim.run, until, progress=None)
    pstats.Stats(prof).sort_stats("tottime").print_stats(40)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--only", default="dashboard,1k,10k", help="targets to time ('' none)")
    parser.add_argument("--sizes", default="", help="job counts for the growth sweep")
    parser.add_argument("--profile", metavar="TARGET", help="cProfile one run and exit")
    args = parser.parse_args()
    if args.profile:
        profile(args.profile)
        return
    report: dict[str, Any] = {"load_before": os.getloadavg()}
    names = [n for n in args.only.split(",") if n]
    if names:
        targets(names, args.runs, report)
    if args.sizes:
        sweep([int(x) for x in args.sizes.split(",")], args.runs, report)
    report["load_after"] = os.getloadavg()
    print(f"load average before {report['load_before'][0]:.1f}, "
          f"after {report['load_after'][0]:.1f} (2 cores)")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    path = out / f"sim-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
