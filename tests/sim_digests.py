"""Pinned digests of seeded simulation runs: the byte-exact event streams a pure speed-up must keep.

``tests/test_sim_digest.py`` recomputes them. A change that is *meant* to alter what the engine
or the simulator does (a new message, another rng draw) changes them too: then regenerate with

    PYTHONPATH=$PWD python tests/sim_digests.py > tests/sim_digests.json

(which updates the entry of the running Python's minor version) and say so in the commit
message. A pure optimisation must leave the file untouched. The digests are per Python minor
version: asyncio itself schedules differently across versions (``wait_for`` was rewritten in
3.12), so the same seed gives a different, equally reproducible, stream there.
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
PY = f"{sys.version_info.major}.{sys.version_info.minor}"


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


def pinned() -> dict[str, Any] | None:
    """The digests recorded for the running Python version, or None."""
    entry: dict[str, Any] | None = json.loads(PINNED.read_text()).get(PY)
    return entry


if __name__ == "__main__":
    table = json.loads(PINNED.read_text()) if PINNED.exists() else {}
    table[PY] = {name: compute(name) for name in SCENARIOS}
    print(json.dumps(table, indent=2))
