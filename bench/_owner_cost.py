"""Workloads 5 and 6, our engine only: what the owner pays per operation, and per queued job.

5. Owner cost per operation at a backlog of 1k, 100k and 1M ready jobs, measured two ways:
   ``state``  -- directly on :class:`istos.core.state.QueueState` (pure, no I/O). Every op is
                 followed by ``drain()``, as the owner does after every change.
   ``owner``  -- through ``QueueOwner.dispatch`` of an app served on the in-process mesh (no
                 transport hop): enqueue, claim (one slot), ack. ``sweep`` at this level is one
                 turn of the owner's sweeper (sweep, drain, publish the events, nudge).
   Ops: enqueue; claim of one job; ack; sweep with nothing expired (8 live leases, as with one
   worker at concurrency 8), in microseconds per call; sweep with 1% of the backlog expired, in
   microseconds per reclaimed lease. A batch of ``batch`` ops is timed per run, and the backlog
   is left as it was (enqueue K, claim K, ack K), so every run sees the same depth.
   The queue runs on a clock the bench sets (no wall-clock jumps, leases expire on demand).
6. Memory: bytes the owner keeps per queued 100-byte job, enqueued through ``app.enqueue`` on
   the in-process mesh: tracemalloc (exact Python allocations) and the RSS delta (what the OS sees).
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import _common as c

from istos import Istos
from istos.clock import ManualClock
from istos.core.state import READY, QueueState
from istos.owner.owner import QueueOwner
from istos.transport.local import LocalMesh

QUEUE = "bench/owner"
BODY = bytes(range(100))
LEASE_S = 30.0
IN_FLIGHT = 8
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = ("enqueue", "claim", "ack", "sweep_idle", "sweep_1pct")




def fill(state: QueueState, size: int, now: float) -> None:
    """Put ``size`` ready jobs on the queue as fast as possible (setup, not measured)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(size):
            state.enqueue(f"fill-{i:018x}", BODY, now)
            if i % 4096 == 0:
                state.drain()
        state.drain()
    finally:
        if enabled:
            gc.enable()
    gc.collect()


def timed(fn: Callable[[], int]) -> float:
    """Run ``fn`` (which returns how many ops it did); microseconds per op."""
    t0 = time.perf_counter_ns()
    n = fn()
    return (time.perf_counter_ns() - t0) / 1e3 / max(1, n)


# -- state level ------------------------------------------------------------------------------
def state_round(state: QueueState, clock: ManualClock, batch: int, tag: str) -> dict[str, float]:
    ids = [f"{tag}-{i:018x}" for i in range(batch)]
    now = clock.t
    held: list[tuple[str, str]] = []

    def enqueue() -> int:
        for jid in ids:
            state.enqueue(jid, BODY, now)
            state.drain()
        return batch

    def claim() -> int:
        slot = ["bench:w#0"]
        for _ in range(batch):
            rec = state.claim(slot, now)[0]
            held.append((rec.job_id, rec.lease_token or ""))
            state.drain()
        return batch

    def ack() -> int:
        for job_id, token in held:
            state.ack(job_id, token, now)
            state.drain()
        return len(held)

    out = {"enqueue": timed(enqueue), "claim": timed(claim), "ack": timed(ack)}
    out["sweep_idle"], out["sweep_1pct"] = sweeps(
        state, clock, batch,
        lambda t: (state.sweep(t), state.drain()))
    return out


def sweeps(state: QueueState, clock: ManualClock, batch: int,
           sweep: Callable[[float], Any]) -> tuple[float, float]:
    """(us per idle sweep, us per reclaimed lease at 1% of the backlog expired)."""
    live = [(r.job_id, r.lease_token or "")
            for r in state.claim([f"bench:w#{i}" for i in range(IN_FLIGHT)], clock.t)]
    state.drain()
    now = clock.t

    def idle() -> int:
        for _ in range(batch):
            sweep(now)
        return batch

    idle_us = timed(idle)
    for job_id, token in live:
        state.ack(job_id, token, now)
    state.drain()
    # 1%: lease that many jobs, let their leases run out, time the sweep that reclaims them.
    # Small backlogs repeat until ``batch`` leases were reclaimed, so every size times as many.
    expire = max(1, state.counts[READY] // 100)
    rounds = max(1, math.ceil(batch / expire))
    total_ns, reclaimed = 0, 0
    for _ in range(rounds):
        slots = [f"bench:x#{i}" for i in range(expire)]
        state.claim(slots, clock.t)
        state.drain()
        clock.t += LEASE_S + 1.0
        t0 = time.perf_counter_ns()
        sweep(clock.t)
        total_ns += time.perf_counter_ns() - t0
        reclaimed += expire
    return idle_us, total_ns / 1e3 / reclaimed


# -- owner level ------------------------------------------------------------------------------
def owner_sweep_turn(owner: QueueOwner, now: float) -> None:
    """One turn of ``QueueOwner._sweep_loop`` after its wait (in-memory storage: no write)."""
    state = owner.state
    before = state.counts[READY]
    state.sweep(now)
    promoted = state.counts[READY] - before
    _, events = state.drain()
    owner._publish(events)
    if promoted > 0:
        owner.nudge(promoted)


async def owner_round(owner: QueueOwner, clock: ManualClock, batch: int,
                      tag: str) -> dict[str, float]:
    v = 1
    enq_msgs = [{"v": v, "op": "enqueue", "body": BODY, "job_id": f"{tag}-{i:018x}",
                 "delay_s": 0.0, "priority": 0} for i in range(batch)]
    claim_msg = {"v": v, "op": "claim", "workers": ["bench:w#0"]}
    acks: list[dict[str, Any]] = []
    dispatch = owner.dispatch
    out: dict[str, float] = {}

    t0 = time.perf_counter_ns()
    for msg in enq_msgs:
        reply = await dispatch(msg)
    out["enqueue"] = (time.perf_counter_ns() - t0) / 1e3 / batch
    assert reply.get("ok"), reply

    t0 = time.perf_counter_ns()
    for _ in range(batch):
        job = (await dispatch(claim_msg))["jobs"][0]
        acks.append({"v": v, "op": "ack", "job_id": job["job_id"], "token": job["token"]})
    out["claim"] = (time.perf_counter_ns() - t0) / 1e3 / batch

    t0 = time.perf_counter_ns()
    for msg in acks:
        reply = await dispatch(msg)
    out["ack"] = (time.perf_counter_ns() - t0) / 1e3 / batch
    assert reply.get("status") == "ok", reply

    out["sweep_idle"], out["sweep_1pct"] = sweeps(
        owner.state, clock, batch, lambda t: owner_sweep_turn(owner, t))
    return out


# -- the workload ---------------------------------------------------------------------------------
def median_by_op(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {op: c.percentile([r[op] for r in rounds], 50) for op in OPS}


async def owner_costs(sizes: list[int], batch: int, runs: int) -> dict[str, Any]:
    results: dict[str, Any] = {"sizes": sizes, "batch": batch, "runs": runs,
                               "state": {}, "owner": {}, "unit": "us/op"}
    for size in sizes:
        clock = ManualClock()
        # No mesh peers and no workers: dispatch is called directly, nothing crosses a transport.
        app = Istos(transport=LocalMesh().transport("bench-owner"), clock=clock,
                    prefix=c.unique_prefix())
        app.queue(QUEUE, lease_s=LEASE_S, max_attempts=1_000_000)
        async with app.serving():
            owner = app.owners[QUEUE]
            t_fill = time.perf_counter()
            fill(owner.state, size, clock.t)
            fill_s = time.perf_counter() - t_fill
            # One untimed round each first: cold caches and the interpreter's specialisation
            # would otherwise land on whichever size runs first.
            state_round(owner.state, clock, batch, "warm-s")
            await owner_round(owner, clock, batch, "warm-o")
            per_state, per_owner = [], []
            for run in range(runs):
                per_state.append(state_round(owner.state, clock, batch, f"s{run}"))
                per_owner.append(await owner_round(owner, clock, batch, f"o{run}"))
                await asyncio.sleep(0)  # let the coalesced nudges flush between runs
            results["state"][str(size)] = median_by_op(per_state)
            results["owner"][str(size)] = median_by_op(per_owner)
            results.setdefault("fill_s", {})[str(size)] = fill_s
            results.setdefault("backlog_after", {})[str(size)] = len(owner.state.jobs)
        del app, owner
        gc.collect()
    lo, hi = str(sizes[0]), str(sizes[-1])
    results["flatness"] = {
        level: {op: results[level][hi][op] / results[level][lo][op] for op in OPS}
        for level in ("state", "owner")}
    return results


def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def owner_memory(jobs: int) -> dict[str, Any]:
    """Bytes retained per queued job: tracemalloc over ``jobs`` enqueues, then the RSS delta of
    a second, untraced app (tracemalloc's own bookkeeping would inflate RSS)."""
    out: dict[str, Any] = {"jobs": jobs}
    for traced in (True, False):
        app = Istos(transport=LocalMesh().transport("bench-mem"), prefix=c.unique_prefix())
        app.queue(QUEUE)
        async with app.serving():
            bodies = [c.make_job(i) for i in range(jobs)]  # the producer's data, not the owner's
            gc.collect()
            if traced:
                tracemalloc.start()
                before = tracemalloc.take_snapshot()
                base = tracemalloc.get_traced_memory()[0]
            else:
                rss0 = rss_bytes()
            for body in bodies:
                await app.enqueue(QUEUE, body)
            gc.collect()
            if traced:
                grown = tracemalloc.get_traced_memory()[0] - base
                after = tracemalloc.take_snapshot()
                tracemalloc.stop()
                top = after.compare_to(before, "lineno")[:8]
                out["tracemalloc_bytes_per_job"] = grown / jobs
                out["top_lines"] = [
                    {"where": f"{os.path.relpath(s.traceback[0].filename, ROOT)}:"
                              f"{s.traceback[0].lineno}",
                     "bytes_per_job": s.size_diff / jobs, "count_per_job": s.count_diff / jobs}
                    for s in top]
                out["event_ring_events"] = len(app.events.recent())
            else:
                out["rss_bytes_per_job"] = (rss_bytes() - rss0) / jobs
            assert len(app.owners[QUEUE].state.jobs) == jobs
            del bodies
        del app
        gc.collect()
    return out
