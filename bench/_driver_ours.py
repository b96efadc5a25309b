"""Benchmark driver for OUR engine (``istos`` from this repository).

Run by ``bench/engine.py`` as ``.venv/bin/python -u bench/_driver_ours.py serve`` (commands on
stdin, see ``_common.py``), and by itself as ``... worker SPEC`` for process B of the two-process
workload. ``... profile WORKLOAD [OUT]`` runs one run of e2e, drain or twoproc under cProfile.

Ack completion is counted at the owner (its ``acked`` JobEvents), the same place the reference
driver counts it (its store's ``ack``), so "last ack" means the same thing for both.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import os
import pstats
import sys
import time
from pathlib import Path
from typing import Any

import _common as c

from istos import Istos, JobEvent
from istos.core.config import WorkerConfig
from istos.worker.worker import WorkerRunner

QUEUE = "bench/jobs"
HERE = os.path.abspath(__file__)


def configs(n: int) -> list[dict[str, Any]]:
    """Private loopback meshes: the tests' helper when it imports, else the same shape."""
    tests = Path(HERE).resolve().parents[1] / "tests"
    if (tests / "zenoh_util.py").is_file():
        sys.path.insert(0, str(tests))
        try:
            from zenoh_util import isolated_configs

            return isolated_configs(n)
        except ImportError:
            pass
        finally:
            sys.path.remove(str(tests))
    return c.zenoh_configs(n)


def count_acks(app: Istos, completion: c.Completion) -> None:
    def listener(event: JobEvent) -> None:
        if event.kind == "acked":
            completion.hit()

    app.events.subscribe(listener)


def runner_stats(app: Istos) -> dict[str, int]:
    claims = sum(r.stats.claims for r in app.runners)
    empty = sum(r.stats.empty_claims for r in app.runners)
    return {"claims": claims, "empty_claims": empty}


def with_claims(result: dict[str, Any], stats: dict[str, int], jobs: int) -> dict[str, Any]:
    result.update(stats)
    result["claims_per_job"] = stats["claims"] / jobs
    result["empty_claims_per_job"] = stats["empty_claims"] / jobs
    return result


async def enqueue_all(app: Istos, jobs: int) -> None:
    for i in range(jobs):
        await app.enqueue(QUEUE, c.make_job(i))


# -- 1. end to end, one process ------------------------------------------------------------------
async def run_e2e(cmd: dict[str, Any]) -> dict[str, Any]:
    jobs, conc = int(cmd["jobs"]), int(cmd["concurrency"])
    app = Istos(zenoh=configs(1)[0], prefix=c.unique_prefix())
    app.queue(QUEUE)
    app.worker(QUEUE, concurrency=conc, prefetch=_prefetch(cmd))(c.noop_handler)
    done = c.Completion(jobs)
    async with app.serving():
        count_acks(app, done)
        t0 = time.perf_counter()
        await enqueue_all(app, jobs)
        t_enq = time.perf_counter()
        t1 = await done.wait(c.deadline_for(jobs))
        result = c.throughput(jobs, t0, t1)
        result["enqueue_phase_s"] = t_enq - t0
        return with_claims(result, runner_stats(app), jobs)


# -- 2. drain a full queue ---------------------------------------------------------------------
def _prefetch(cmd: dict[str, Any]) -> int | None:
    """The worker's prefetch: None (the engine's automatic default) unless --prefetch N."""
    value = cmd.get("prefetch")
    return None if value is None else int(value)


async def start_late_worker(app: Istos, queue: str, concurrency: int,
                            prefetch: int | None = None) -> WorkerRunner:
    """Start a worker on an app that is already serving (the app has no public call for it:
    ``app.start`` builds runners the same way for the workers declared before serving)."""
    config = WorkerConfig.build(queue, concurrency=concurrency, prefetch=prefetch)
    runner = WorkerRunner(config, c.noop_handler, app.node, app.client(queue),
                          shutdown_grace_s=app.shutdown_grace_s)
    app.runners.append(runner)  # so the owner's in-process nudges reach it
    await runner.start()
    return runner


async def run_drain(cmd: dict[str, Any]) -> dict[str, Any]:
    jobs, conc = int(cmd["jobs"]), int(cmd["concurrency"])
    app = Istos(zenoh=configs(1)[0], prefix=c.unique_prefix())
    app.queue(QUEUE)
    done = c.Completion(jobs)
    async with app.serving():
        count_acks(app, done)
        await enqueue_all(app, jobs)
        t0 = time.perf_counter()
        await start_late_worker(app, QUEUE, conc, _prefetch(cmd))
        t1 = await done.wait(c.deadline_for(jobs))
        return with_claims(c.throughput(jobs, t0, t1), runner_stats(app), jobs)


# -- 3. two processes: owner + producer here (A), worker in a child (B) ----------------------------
async def run_twoproc(cmd: dict[str, Any]) -> dict[str, Any]:
    jobs, conc = int(cmd["jobs"]), int(cmd["concurrency"])
    cfg_a, cfg_b = configs(2)
    prefix = c.unique_prefix()
    app = Istos(zenoh=cfg_a, prefix=prefix)
    app.queue(QUEUE)
    done = c.Completion(jobs)
    async with app.serving():
        count_acks(app, done)
        child = c.WorkerProcess(HERE, {"zenoh": cfg_b, "prefix": prefix, "concurrency": conc,
                                       "prefetch": _prefetch(cmd),
                                       "profile": cmd.get("profile_b")})
        try:
            await child.start()  # returns once B's first claim was answered by our owner
            t0 = time.perf_counter()
            await enqueue_all(app, jobs)
            t_enq = time.perf_counter()
            t1 = await done.wait(c.deadline_for(jobs))
            stats = await child.stop()
        finally:
            await child.kill()
        result = c.throughput(jobs, t0, t1)
        result["enqueue_phase_s"] = t_enq - t0
        return with_claims(result, stats, jobs)


async def worker_main(spec: dict[str, Any]) -> None:
    """Process B: serve one worker until the parent writes a line, then report claim counts."""
    app = Istos(zenoh=spec["zenoh"], prefix=spec["prefix"])
    app.worker(QUEUE, concurrency=int(spec["concurrency"]),
               prefetch=_prefetch(spec))(c.noop_handler)
    async with app.serving():
        # Ready once a claim came back: the owner has seen this node, and the nudge subscriber
        # declared before that claim is routed to it.
        await c.wait_until(lambda: runner_stats(app)["claims"] >= 1, "a first claim answered")
        c.report_ready()
        await c.wait_for_stop_line()
        stats = runner_stats(app)
    c.report(stats)


# -- 4. enqueue latency, owner in-process --------------------------------------------------------
async def run_latency(cmd: dict[str, Any]) -> dict[str, Any]:
    jobs = int(cmd["jobs"])
    app = Istos(zenoh=configs(1)[0], prefix=c.unique_prefix())
    app.queue(QUEUE)
    samples: list[float] = []
    async with app.serving():
        perf = time.perf_counter
        for i in range(jobs):
            body = c.make_job(i)
            t = perf()
            await app.enqueue(QUEUE, body)
            samples.append(perf() - t)
    return c.latency_figures(samples)


# -- 5 and 6: owner cost and memory (no transport; see _owner_cost.py) ------------------------
async def run_owner(cmd: dict[str, Any]) -> dict[str, Any]:
    import _owner_cost

    return await _owner_cost.owner_costs(
        sizes=[int(s) for s in cmd["sizes"]], batch=int(cmd["batch"]), runs=int(cmd["runs"]))


async def run_memory(cmd: dict[str, Any]) -> dict[str, Any]:
    import _owner_cost

    return await _owner_cost.owner_memory(int(cmd["jobs"]))


HANDLERS: dict[str, c.Handler] = {
    "e2e": run_e2e, "drain": run_drain, "twoproc": run_twoproc, "latency": run_latency,
    "owner": run_owner, "memory": run_memory,
}


# -- profiling -----------------------------------------------------------------------------
def dump_profile(prof: cProfile.Profile, out: str, title: str, top: int = 35) -> None:
    with open(out, "w") as fh:
        fh.write(f"# {title}\n")
        for key in ("tottime", "cumulative"):
            fh.write(f"\n## sorted by {key}\n")
            stats = pstats.Stats(prof, stream=fh)
            stats.strip_dirs().sort_stats(key).print_stats(top)


def profile_main(workload: str, out_dir: str, jobs: int, conc: int) -> None:
    os.makedirs(out_dir, exist_ok=True)
    cmd: dict[str, Any] = {"jobs": jobs, "concurrency": conc}
    if workload == "twoproc":
        cmd["profile_b"] = os.path.join(out_dir, "profile-ours-twoproc-B.txt")
    prof = cProfile.Profile()
    prof.enable()
    result = asyncio.run(HANDLERS[workload](cmd))
    prof.disable()
    side = "-A" if workload == "twoproc" else ""
    out = os.path.join(out_dir, f"profile-ours-{workload}{side}.txt")
    dump_profile(prof, out, f"ours {workload}{side}: {json.dumps(result)}")
    print(json.dumps({"workload": workload, "result": result, "profile": out}))


def main(argv: list[str]) -> None:
    mode = argv[1] if len(argv) > 1 else "serve"
    if mode == "worker":
        spec = json.loads(argv[2])
        if spec.get("profile"):
            prof = cProfile.Profile()
            prof.enable()
            asyncio.run(worker_main(spec))
            prof.disable()
            dump_profile(prof, spec["profile"], "ours twoproc-B (worker process)")
        else:
            asyncio.run(worker_main(spec))
    elif mode == "profile":
        out_dir = argv[3] if len(argv) > 3 else os.path.join(os.path.dirname(HERE), "results")
        profile_main(argv[2], out_dir, jobs=int(os.environ.get("BENCH_JOBS", "2000")),
                     conc=int(os.environ.get("BENCH_CONCURRENCY", "8")))
    else:
        import istos

        c.serve_commands(HANDLERS, {"package": "ours", "file": istos.__file__,
                                    "version": getattr(istos, "__version__", "?"),
                                    "python": sys.version.split()[0]})


if __name__ == "__main__":
    main(sys.argv)
