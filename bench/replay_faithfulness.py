"""How far replay's duplicate prediction is from live runs, with and without a worker restart.

    python -m bench.replay_faithfulness --runs 10          # 10 with a restart, 10 without

Each run is the live experiment of ``tests/test_replay_live.py`` (its workload, policy and
worker processes): an owner, queue ``q1`` (lease 4 s) recorded with ``LiveQueue.arecord`` and
queue ``q2`` (lease 0.25 s, below the slow runs) doing the same jobs at the same moments; with
``--restart`` one worker of each fleet is SIGKILLed mid-run and started again under its own
name. The recording of ``q1`` is replayed with ``lease_s=0.25`` (``predict``, the mean over the
test's replay seeds) and the prediction is divided by the duplicated runs ``q2`` showed live.
Runs alternate restart / no restart, so a drift of the machine's load hits both alike. Raw runs
go to ``bench/results/replay-faithfulness-<date>.json`` (gitignored); the summary (mean, sd, and
the bound a new run's ratio falls in with probability 0.999 under a normal model) is printed.
About 40 s of wall time per run on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from helpers import wait_events  # noqa: E402
from test_replay_live import (  # noqa: E402
    KILL_AT_S,
    LEASE_S,
    POLICY,
    PREDICT_SEEDS,
    RECORD_S,
    RESTART_AFTER_S,
    SHORT_LEASE_S,
    Worker,
    duplicated_runs,
    workload,
)
from zenoh_util import isolated_configs, unique_prefix, wait_until  # noqa: E402

from istos import Istos  # noqa: E402
from istos_nb.attach import aattach  # noqa: E402
from istos_nb.views.compare import predict  # noqa: E402

# Student's t, two-sided 0.001, by degrees of freedom (n - 1) for the runs this bench makes.
T_999 = {5: 6.869, 6: 5.959, 7: 5.408, 8: 5.041, 9: 4.781, 10: 4.587, 11: 4.437, 12: 4.318,
         13: 4.221, 14: 4.140, 15: 4.073, 19: 3.883, 24: 3.745, 29: 3.659}


async def drive(owner: Istos, queue: str, jobs: list[tuple[float, dict[str, Any]]],
                workers: dict[str, Worker], victim: str | None) -> list[str]:
    """Enqueue at the planned offsets; with ``victim``, kill it at KILL_AT_S while it runs a
    job and start it again RESTART_AFTER_S later; wait until every job ended."""
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def kill_and_restart(name: str) -> None:
        old = workers[name]
        await asyncio.sleep(KILL_AT_S)
        await wait_until(lambda: old.running > 0, 30, "the victim runs a job")
        await asyncio.to_thread(old.kill)
        workers[name + "-old"] = old
        await asyncio.sleep(RESTART_AFTER_S)
        workers[name] = new = await asyncio.to_thread(Worker, *old.args)
        assert await asyncio.to_thread(new.ready.wait, 60), new.proc.stderr

    killer = asyncio.ensure_future(kill_and_restart(victim)) if victim else None
    ids = []
    for i, (offset, body) in enumerate(jobs):
        await asyncio.sleep(max(0.0, start + offset - loop.time()))
        ids.append(await owner.enqueue(queue, body, job_id=f"{queue}-{i}"))
    if killer is not None:
        await killer
    wanted = set(ids)
    await wait_events(owner, lambda evs: wanted <= {e.job_id for e in evs if e.queue == queue
                                                    and e.kind in ("acked", "dead_lettered")},
                      timeout_s=90)
    return ids


async def one_run(restart: bool) -> dict[str, Any]:
    configs, prefix = isolated_configs(6), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q1", **POLICY)
    owner.queue("q2", **{**POLICY, "lease_s": SHORT_LEASE_S})
    jobs = workload(27)
    async with owner.serving():
        workers = {name: Worker(configs[i], prefix, name, queue) for i, (name, queue) in
                   enumerate([("wa1", "q1"), ("wb1", "q1"), ("wa2", "q2"), ("wb2", "q2")], 1)}
        lq = None
        try:
            for w in workers.values():
                assert await asyncio.to_thread(w.ready.wait, 60), w.proc.stderr
            lq = await aattach("q1", configs[5], prefix=prefix, timeout_s=10)
            live = threading.Event()
            recording = asyncio.ensure_future(lq.arecord(RECORD_S, on_start=live.set))
            assert await asyncio.to_thread(live.wait, 30)
            _, ids2 = await asyncio.gather(
                drive(owner, "q1", jobs, workers, "wb1" if restart else None),
                drive(owner, "q2", jobs, workers, "wb2" if restart else None))
            trace = await asyncio.wait_for(recording, RECORD_S + 60)
        finally:
            for w in workers.values():
                w.kill()
            if lq is not None:
                await lq.aclose()
    names = [n for n in workers if n.endswith("2") or n.endswith("2-old")]
    live_dups = duplicated_runs([d for n in names for d in workers[n].done], ids2)
    predicted = float(predict(trace, seeds=PREDICT_SEEDS,
                              lease_s=SHORT_LEASE_S).loc["duplicated_runs", "mean"])
    return {"restart": restart, "crashes": len(trace.crashes), "live": live_dups,
            "predicted": predicted, "ratio": predicted / live_dups if live_dups else math.nan,
            "lease_s": LEASE_S}


def summary(ratios: list[float]) -> dict[str, float]:
    n = len(ratios)
    mean, sd = statistics.mean(ratios), statistics.stdev(ratios) if n > 1 else math.nan
    t = T_999.get(n - 1, math.nan)
    half = t * sd * math.sqrt(1 + 1 / n)
    return {"n": n, "mean": mean, "sd": sd, "min": min(ratios), "max": max(ratios),
            "t_999": t, "lo": mean - half, "hi": mean + half,
            "mean_t": (mean - 1) / (sd / math.sqrt(n)) if n > 1 and sd > 0 else math.nan}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each kind")
    args = parser.parse_args()
    out = ROOT / "bench" / "results" / f"replay-faithfulness-{time.strftime('%Y%m%d-%H%M')}.json"
    out.parent.mkdir(exist_ok=True)
    rows: list[dict[str, Any]] = []
    for i in range(2 * args.runs):
        row = asyncio.run(one_run(restart=i % 2 == 0))
        rows.append(row)
        print(json.dumps(row), flush=True)
        out.write_text(json.dumps(rows, indent=1))
    for restart in (True, False):
        ratios = [r["ratio"] for r in rows if r["restart"] is restart and r["live"]]
        if ratios:
            print(("with" if restart else "without") + " a restart:",
                  json.dumps({k: round(v, 3) for k, v in summary(ratios).items()}))


if __name__ == "__main__":
    main()
