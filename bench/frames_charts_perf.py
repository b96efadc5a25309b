"""Perf sanity check (not a test): every frame and chart for ~10k synthetic events.

Run: ``.venv/bin/python bench/frames_charts_perf.py [n_events]``. Target: the whole dashboard
(normalise once, build all frames, draw and render all six charts) in under one second.
"""

from __future__ import annotations

import io
import math
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from istos.events import JobEvent  # noqa: E402
from istos_nb import charts, frames  # noqa: E402

SLOTS = [f"n{n}:work#{s}" for n in range(4) for s in range(4)]


def synthetic_events(n_events: int, seed: int = 7) -> list[JobEvent]:
    """A plausible stream: jobs are enqueued, claimed, then acked, nacked or expire, retry with
    exponential backoff and dead-letter after 4 attempts; a node crashes now and then."""
    rng = random.Random(seed)
    out: list[JobEvent] = []
    t_arrival, i = 0.0, 0
    while len(out) < n_events:
        job, t_arrival, i = f"job{i}", t_arrival + rng.expovariate(20.0), i + 1
        delay = rng.choice([0.0] * 9 + [2.0])
        out.append(JobEvent(t_arrival, "n0", "q", job, "enqueued", 0, None,
                            {"priority": 0, "delay_s": delay, "ready_at": t_arrival + delay}))
        t = t_arrival + delay
        for attempt in range(1, 5):
            t += rng.expovariate(2.0)
            worker = rng.choice(SLOTS)
            out.append(JobEvent(t, "n0", "q", job, "claimed", attempt, worker,
                                {"deadline": t + 5.0, "lease_s": 5.0}))
            roll = rng.random()
            if roll < 0.8:
                t += rng.uniform(0.05, 1.0)
                out.append(JobEvent(t, "n0", "q", job, "acked", attempt, worker))
                break
            if roll < 0.92:
                t += rng.uniform(0.05, 1.0)
                out.append(JobEvent(t, "n0", "q", job, "nacked", attempt, worker,
                                    {"error": "boom"}))
                delay = min(0.5 * 2 ** (attempt - 1), 8.0) * rng.uniform(0.9, 1.1)
            else:
                t += 5.0
                out.append(JobEvent(t, "n0", "q", job, "lease_expired", attempt, worker,
                                    {"deadline": t}))
                delay = 0.0
            if attempt == 4:
                out.append(JobEvent(t, "n0", "q", job, "dead_lettered", attempt, None,
                                    {"error": "boom"}))
                break
            out.append(JobEvent(t, "n0", "q", job, "retry_scheduled", attempt, None,
                                {"delay_s": delay, "ready_at": t + delay, "error": "boom"}))
            t += delay
        if rng.random() < 0.002:
            out.append(JobEvent(t_arrival, f"n{rng.randrange(4)}", "", "", "crashed"))
    return out[:n_events]


def _best_of(repeats: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    """Fastest of ``repeats`` runs (seconds) and the last result: the machine may be shared."""
    best, result = math.inf, None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def main(n_events: int = 10_000, repeats: int = 3) -> None:
    events = synthetic_events(n_events)
    timings: dict[str, float] = {}
    timings["events_frame"], df = _best_of(repeats, lambda: frames.events_frame(events))
    for name in ("jobs_frame", "leases_frame", "attempts_frame", "depth_frame",
                 "throughput_frame", "node_events_frame"):
        timings[name], _ = _best_of(repeats, lambda fn=getattr(frames, name): fn(df))
    builders: dict[str, Callable[[Any], Figure]] = {
        "lease_gantt": charts.lease_gantt,
        "retry_timeline": charts.retry_timeline,
        "backoff_curve": lambda d: charts.backoff_curve(d, 0.5, 8.0, 0.1),
        "depth_chart": charts.depth_chart,
        "attempts_histogram": charts.attempts_histogram,
        "throughput_chart": charts.throughput_chart,
    }
    for name, build in builders.items():
        timings[f"{name} (build)"], fig = _best_of(repeats, lambda build=build: build(df))
        timings[f"{name} (render)"], _ = _best_of(
            repeats, lambda fig=fig: fig.savefig(io.BytesIO(), format="png", dpi=80))

    def dashboard_pass() -> None:
        normalised = frames.events_frame(events)
        for build in builders.values():
            build(normalised).savefig(io.BytesIO(), format="png", dpi=80)

    one_pass, _ = _best_of(repeats, dashboard_pass)
    n_leases = len(frames.leases_frame(df))
    print(f"{len(events)} events, {n_leases} leases, {df['job_id'].nunique() - 1} jobs "
          f"(best of {repeats} runs per step)")
    for name, seconds in timings.items():
        print(f"  {name:<28} {seconds * 1000:8.1f} ms")
    frames_total = sum(v for k, v in timings.items() if k.endswith("_frame"))
    dashboard = sum(v for k, v in timings.items() if "(" in k) + timings["events_frame"]
    print(f"frames total {frames_total * 1000:.0f} ms; "
          f"sum of dashboard steps {dashboard * 1000:.0f} ms; one end-to-end dashboard pass "
          f"(normalise + 6 charts built and rendered to PNG) {one_pass * 1000:.0f} ms")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)
