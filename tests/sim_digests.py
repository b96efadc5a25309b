"""Pinned digests of seeded simulation runs: the byte-exact event streams a pure speed-up must keep.

``tests/test_sim_digest.py`` recomputes them. A change that is *meant* to alter what the engine
or the simulator does (a new message, another rng draw) changes them too: then regenerate with

    PYTHONPATH=$PWD python tests/sim_digests.py > tests/sim_digests.json

and say so in the commit message. A pure optimisation must leave the file untouched. The
digests do not depend on the Python version: the same seeds give byte-identical streams on
3.10, 3.11, 3.12 and 3.13 (checked 2026-12-01 with each interpreter), so one table serves every
supported version and the test never skips. Should a future Python schedule differently, that
is a finding: make the engine's order independent of it rather than pinning a second table.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from sim_scenarios import faulty_scenario  # noqa: E402

from istos_nb.sim import Simulation  # noqa: E402
from istos_nb.sim.result import SimResult  # noqa: E402
from istos_nb.views.scenario import scenario_from_params  # noqa: E402

PINNED = Path(__file__).parent / "sim_digests.json"


def bench_like(jobs: int, seed: int) -> tuple[Simulation, float]:
    """bench/sim.py's scenario, smaller: durable storage, Poisson arrivals, 5% crashing runs."""
    sim = Simulation(seed=seed, storage="durable")
    owner = sim.node("owner")
    owner.queue("q", lease_s=30, max_attempts=5, retry_backoff_s=1.0)
    for i in range(2):
        w = sim.node(f"worker-{i}")
        w.worker("q", concurrency=4)(sim.handler(service_s=("exp", 0.5), crash_p=0.05))
    sim.enqueue_jobs("owner", "q", jobs, rate=jobs / 300.0, poisson=True)
    return sim, 400.0


SCENARIOS: dict[str, Callable[[], tuple[Simulation, float]]] = {
    "dashboard_default": lambda: scenario_from_params(),
    "dashboard_400_jobs_seed_3": lambda: scenario_from_params({"jobs": 400, "seed": 3}),
    "faulty_11": lambda: (faulty_scenario(11), 400.0),
    "bench_like_300": lambda: bench_like(300, 5),
}


def digest(result: SimResult) -> str:
    """sha256 over everything a run records: events, enqueue attempts, side effects, crashes."""
    record: dict[str, Any] = {
        "events": result.events_raw, "attempts": result.attempts, "effects": result.effects,
        "owner_crashes": result.owner_crashes, "held": sorted(result.held),
        "virtual_s": result.virtual_s,
    }
    # json writes floats with repr(): exact, so a last-bit difference changes the digest
    text = json.dumps(record, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def compute(name: str) -> dict[str, Any]:
    sim, until = SCENARIOS[name]()
    result = sim.run(until, progress=None)
    return {"digest": digest(result), "events": len(result.events_raw)}


def pinned() -> dict[str, Any]:
    """The recorded digests (the same for every supported Python version)."""
    table: dict[str, Any] = json.loads(PINNED.read_text())
    return table


if __name__ == "__main__":
    print(json.dumps({name: compute(name) for name in SCENARIOS}, indent=2))
