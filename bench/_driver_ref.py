"""Benchmark driver for the REFERENCE package ``istos==0.3.4`` (the public baseline).

Run by ``bench/engine.py`` with ``bench/.ref-venv/bin/python -u bench/_driver_ref.py serve``.
Being run as a script puts ``bench/`` (not the repository root) first on ``sys.path``, so
``import istos`` finds the reference in the venv's site-packages, never our package; the
``hello`` answer reports the file it came from and the orchestrator checks it.

Its API differs from ours in the details this driver adapts:
- ``Istos(config=zenoh.Config)`` (no key prefix: queue names are full key expressions, so each
  run uses a queue under a unique prefix);
- queue calls always cross the Zenoh session, even to an owner in the same app;
- a worker can be started on a serving app by calling its wrapper's ``start(app)``;
- there is no event log: acks are counted by wrapping the owner store's ``ack`` (the same point
  where our driver counts them), claims by wrapping the app's ``_queue_claim``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
import warnings
from typing import Any

import _common as c
import zenoh

import istos
from istos import Istos

warnings.filterwarnings("ignore")  # the reference warns about its open built-in endpoints
logging.getLogger("istos").setLevel(logging.WARNING)


def new_app(cfg: dict[str, Any]) -> Istos:
    return Istos(config=zenoh.Config.from_json5(json.dumps(cfg)), log_level="WARNING",
                 configure_logging=False)


def queue_name() -> str:
    return f"{c.unique_prefix()}/jobs"


def count_acks(role: Any, completion: c.Completion) -> None:
    ack = role.store.ack

    async def counted(*args: Any, **kwargs: Any) -> Any:
        ok = await ack(*args, **kwargs)
        completion.hit()
        return ok

    role.store.ack = counted


class ClaimCounter:
    """Counts the worker side's claims (the reference claims one job per request)."""

    def __init__(self, app: Istos) -> None:
        self.claims = 0
        self.empty_claims = 0
        claim = app._queue_claim

        async def counted(*args: Any, **kwargs: Any) -> Any:
            reply = await claim(*args, **kwargs)
            self.claims += 1
            if not reply or reply.get("empty"):
                self.empty_claims += 1
            return reply

        app._queue_claim = counted  # type: ignore[method-assign]

    def stats(self) -> dict[str, int]:
        return {"claims": self.claims, "empty_claims": self.empty_claims}


def with_claims(result: dict[str, Any], stats: dict[str, int], jobs: int) -> dict[str, Any]:
    result.update(stats)
    result["claims_per_job"] = stats["claims"] / jobs
    result["empty_claims_per_job"] = stats["empty_claims"] / jobs
    return result


async def enqueue_all(app: Istos, queue: str, jobs: int) -> None:
    for i in range(jobs):
        await app.enqueue(queue, c.make_job(i))


async def run_e2e(cmd: dict[str, Any]) -> dict[str, Any]:
    jobs, conc = int(cmd["jobs"]), int(cmd["concurrency"])
    app, queue = new_app(c.zenoh_configs(1)[0]), queue_name()
    role = app.queue(queue)
    app.worker(queue, concurrency=conc)(c.noop_handler)
    done = c.Completion(jobs)
    count_acks(role, done)
    claims = ClaimCounter(app)
    async with app.serving():
        t0 = time.perf_counter()
        await enqueue_all(app, queue, jobs)
        t_enq = time.perf_counter()
        t1 = await done.wait(c.deadline_for(jobs))
        result = c.throughput(jobs, t0, t1)
        result["enqueue_phase_s"] = t_enq - t0
        return with_claims(result, claims.stats(), jobs)


async def run_drain(cmd: dict[str, Any]) -> dict[str, Any]:
    jobs, conc = int(cmd["jobs"]), int(cmd["concurrency"])
    app, queue = new_app(c.zenoh_configs(1)[0]), queue_name()
    role = app.queue(queue)
    done = c.Completion(jobs)
    count_acks(role, done)
    claims = ClaimCounter(app)
    async with app.serving():
        await enqueue_all(app, queue, jobs)
        wrapper = app.worker(queue, concurrency=conc)(c.noop_handler)  # stopped at shutdown
        t0 = time.perf_counter()
        wrapper.start(app)
        t1 = await done.wait(c.deadline_for(jobs))
        return with_claims(c.throughput(jobs, t0, t1), claims.stats(), jobs)


async def run_twoproc(cmd: dict[str, Any]) -> dict[str, Any]:
    jobs, conc = int(cmd["jobs"]), int(cmd["concurrency"])
    cfg_a, cfg_b = c.zenoh_configs(2)
    app, queue = new_app(cfg_a), queue_name()
    role = app.queue(queue)
    done = c.Completion(jobs)
    count_acks(role, done)
    async with app.serving():
        child = c.WorkerProcess(__file__, {"zenoh": cfg_b, "queue": queue, "concurrency": conc})
        try:
            await child.start()  # returns once B's first claim was answered by our owner
            t0 = time.perf_counter()
            await enqueue_all(app, queue, jobs)
            t_enq = time.perf_counter()
            t1 = await done.wait(c.deadline_for(jobs))
            stats = await child.stop()
        finally:
            await child.kill()
        result = c.throughput(jobs, t0, t1)
        result["enqueue_phase_s"] = t_enq - t0
        return with_claims(result, stats, jobs)


async def worker_main(spec: dict[str, Any]) -> None:
    app = new_app(spec["zenoh"])
    app.worker(spec["queue"], concurrency=int(spec["concurrency"]))(c.noop_handler)
    claims = ClaimCounter(app)
    async with app.serving():
        # Ready once a claim came back: the owner has seen this node, and the notify subscriber
        # declared before that claim is routed to it.
        await c.wait_until(lambda: claims.claims >= 1, "a first claim answered")
        c.report_ready()
        await c.wait_for_stop_line()
    c.report(claims.stats())


async def run_latency(cmd: dict[str, Any]) -> dict[str, Any]:
    jobs = int(cmd["jobs"])
    app, queue = new_app(c.zenoh_configs(1)[0]), queue_name()
    app.queue(queue)
    samples: list[float] = []
    async with app.serving():
        perf = time.perf_counter
        for i in range(jobs):
            body = c.make_job(i)
            t = perf()
            await app.enqueue(queue, body)
            samples.append(perf() - t)
    return c.latency_figures(samples)


HANDLERS: dict[str, c.Handler] = {
    "e2e": run_e2e, "drain": run_drain, "twoproc": run_twoproc, "latency": run_latency,
}


def version() -> str:
    from importlib.metadata import version as dist_version

    return dist_version("istos")


def main(argv: list[str]) -> None:
    mode = argv[1] if len(argv) > 1 else "serve"
    if mode == "worker":
        asyncio.run(worker_main(json.loads(argv[2])))
    else:
        c.serve_commands(HANDLERS, {"package": "reference", "file": istos.__file__,
                                    "version": version(), "python": sys.version.split()[0]})


if __name__ == "__main__":
    main(sys.argv)
