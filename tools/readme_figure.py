"""Draw the README's picture: a lease chart of a worker crash and its job's redelivery.

    python tools/readme_figure.py                    # writes docs/img/crash-redelivery.png
    python tools/readme_figure.py --out other.png

The same simulated run as notebooks/01-quickstart (seed 1, twelve 3-second jobs on two
workers with two slots each, lease 10 s; worker-b is killed at t = 5 s and back at t = 15 s),
drawn with ``istos_nb.views.charts.lease_gantt``. Deterministic: the same seed gives the same run.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

from istos_nb.sim import Simulation  # noqa: E402
from istos_nb.sim.result import SimResult  # noqa: E402
from istos_nb.views.charts import lease_gantt, resize  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "img" / "crash-redelivery.png"


async def resize_image(job: dict[str, Any]) -> None:
    await asyncio.sleep(job["work_s"])  # virtual seconds in the simulator


def crash_run() -> SimResult:
    """Notebook 01's first run: worker-b dies at t = 5 s holding a job, which comes back."""
    sim = Simulation(seed=1)
    sim.node("owner").queue("jobs/resize", lease_s=10, max_attempts=3)
    for name in ("worker-a", "worker-b"):
        sim.node(name).worker("jobs/resize", concurrency=2)(resize_image)
    producer = sim.node("producer")
    for i in range(12):
        sim.at(float(i), producer.enqueue, "jobs/resize", {"path": f"img{i}.png", "work_s": 3.0})
    sim.crash("worker-b", at=5.0, restart_after=10.0)
    return sim.run(until=60.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"PNG to write (default {OUT})")
    args = parser.parse_args(argv)
    fig = lease_gantt(crash_run().events,
                      title="worker-b dies at t = 5 s; its job's lease expires and it runs again")
    resize(fig, 9.0)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, format="png", dpi=100, metadata={"Software": None})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
