"""Pickup latency: enqueue reply -> handler start on a remote, idle worker; parked claims vs nudges.

    .venv/bin/python -m bench.pickup [--rounds 5] [--n 300] [--gap-ms 5]

Three processes on a private loopback mesh: the owner (an Istos app owning the queue, plus a raw
zenoh-python queryable that replies inline), one worker (concurrency 8, poll interval 5 s) and
the producer (this process). The producer enqueues ``--n`` jobs one at a time, ``--gap-ms``
apart so that the worker is idle again before each; per job, pickup = the worker's handler
start minus the moment the producer got the enqueue reply (``time.perf_counter``: one
CLOCK_MONOTONIC for every process on the host). After the jobs it times as many raw
``session.get`` round trips to the owner's process, ``--gap-ms`` apart as the jobs were (each
wakes idle threads, as a pickup does): the round trip the target is stated against.
``bench.peers`` compares its pickup with the same kind of figure (``_raw_limits.py``'s
``spaced``).

Variants, interleaved per round (order rotated): ``park`` (the default: the idle worker's claim
waits at the owner; concurrency 8, automatic prefetch), ``park-c1`` (concurrency 1, no
prefetch), ``park-prefetch`` (concurrency 8, ``prefetch=16``), ``park-backlog`` (as ``park``,
but the worker starts on a backlog of 2,000 jobs, so its first claims all bring jobs, as in
``bench.peers``' round) and ``nudge`` (``park=False``: enqueue -> nudge message -> claim). With
parking the job can start before the producer even has its reply (the two messages leave the
owner together), so a pickup may be negative. ``--variants`` picks a subset.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from _common import percentile, zenoh_configs  # noqa: E402

QUEUE = "bench/pickup"
TAG = "@@"
# variant -> (park, concurrency, prefetch, backlog jobs before the worker starts)
VARIANTS: dict[str, tuple[bool, int, int | None, int]] = {
    "park": (True, 8, None, 0),
    "park-c1": (True, 1, 0, 0),
    "park-prefetch": (True, 8, 16, 0),
    "park-backlog": (True, 8, None, 2000),
    "nudge": (False, 8, None, 0),
}


def child(role: str, spec: dict[str, Any]) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-u", __file__, role, json.dumps(spec)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/",
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != TAG + "READY":
        proc.kill()
        raise RuntimeError(f"{role} did not start: {line!r}")
    return proc


async def run_owner(spec: dict[str, Any]) -> None:
    import zenoh

    from istos import Istos

    app = Istos(zenoh=spec["cfgs"][0], prefix=spec["prefix"])
    app.queue(QUEUE)
    async with app.serving():
        session = app.node.transport._session  # type: ignore[union-attr]

        def raw(query: zenoh.Query) -> None:
            query.reply(query.key_expr, b"")

        handle = session.declare_queryable(f"{spec['prefix']}/raw",
                                           zenoh.handlers.Callback(raw, indirect=False))
        print(TAG + "READY", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        handle.undeclare()


async def run_worker(spec: dict[str, Any]) -> None:
    from istos import Istos

    app = Istos(zenoh=spec["cfgs"][1], prefix=spec["prefix"])
    starts: dict[int, float] = {}
    park, concurrency, prefetch, _ = VARIANTS[spec["variant"]]

    @app.worker(QUEUE, concurrency=concurrency, poll_interval_s=5.0, park=park,
                prefetch=prefetch)
    async def handle(job: dict[str, Any]) -> None:
        if "i" in job:
            starts.setdefault(job["i"], time.perf_counter())

    async with app.serving():
        print(TAG + "READY", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
    print(TAG + json.dumps(starts), flush=True)


async def produce(spec: dict[str, Any]) -> dict[str, Any]:
    from istos import Istos

    app = Istos(zenoh=spec["cfgs"][2], prefix=spec["prefix"])
    n, gap = int(spec["n"]), float(spec["gap_ms"]) / 1e3
    replies: dict[int, float] = {}
    rtts: list[float] = []
    async with app.serving():
        session = app.node.transport._session  # type: ignore[union-attr]
        await app.client(QUEUE).call("ping")  # waits for the route
        raw_key = f"{spec['prefix']}/raw"
        for _ in range(20):
            list(session.get(raw_key))
        perf = time.perf_counter
        for i in range(-20, n):  # 20 warm-up jobs first
            await app.enqueue(QUEUE, {"i": i, "pad": "x" * 70})
            replies[i] = perf()
            await asyncio.sleep(gap)
        # The raw round trip between the same processes, spaced as the jobs were, after them:
        # a query between two jobs would wake the owner's threads just before each job.
        for _ in range(n + 20):
            t = perf()
            for _ in session.get(raw_key):  # blocking: nothing else runs meanwhile
                pass
            rtts.append(perf() - t)
            await asyncio.sleep(gap)
    return {"replies": replies, "rtts": rtts}


async def backlog(spec: dict[str, Any], jobs: int) -> None:
    """Fill the queue before the worker starts (its first claims then all bring jobs)."""
    from istos import Istos

    app = Istos(zenoh=spec["cfgs"][2], prefix=spec["prefix"])
    async with app.serving():
        await app.client(QUEUE).call("ping")  # waits for the route
        await app.enqueue_many(QUEUE, [{"backlog": k} for k in range(jobs)])


def one(variant: str, n: int, gap_ms: float) -> dict[str, Any]:
    spec = {"cfgs": zenoh_configs(3), "prefix": f"istos-bench/{secrets.token_hex(6)}",
            "variant": variant, "n": n, "gap_ms": gap_ms}
    owner = child("owner", spec)
    if VARIANTS[variant][3]:
        asyncio.run(backlog(spec, VARIANTS[variant][3]))
    worker = child("worker", spec)
    try:
        got = asyncio.run(produce(spec))
        time.sleep(0.5)  # (a bench: the last job starts long before this)
        assert worker.stdin is not None and worker.stdout is not None
        worker.stdin.write("stop\n")
        worker.stdin.flush()
        starts: dict[str, float] = {}
        for line in worker.stdout:
            if line.startswith(TAG):
                starts = json.loads(line[len(TAG):])
                break
    finally:
        for proc in (worker, owner):
            if proc.stdin is not None and not proc.stdin.closed:
                proc.stdin.close()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
    pick = [(starts[str(i)] - t) * 1e3 for i, t in got["replies"].items()
            if i >= 0 and str(i) in starts]
    rtt = [x * 1e3 for x in got["rtts"][20:]]
    return {"pickup_p50": percentile(pick, 50), "pickup_p99": percentile(pick, 99),
            "raw_p50": percentile(rtt, 50), "raw_p99": percentile(rtt, 99),
            "started": len(pick), "n": n}


def main(argv: list[str]) -> None:
    if len(argv) > 2 and argv[1] in ("owner", "worker"):
        spec = json.loads(argv[2])
        asyncio.run(run_owner(spec) if argv[1] == "owner" else run_worker(spec))
        return
    p = argparse.ArgumentParser(prog="python -m bench.pickup")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--n", type=int, default=300)
    p.add_argument("--gap-ms", type=float, default=5.0)
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="comma-separated subset of " + ",".join(VARIANTS))
    args = p.parse_args(argv[1:])
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        p.error(f"unknown variant(s) {sorted(unknown)}")
    load = os.getloadavg()
    raw: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(args.rounds):
        shift = r % len(variants)
        for v in variants[shift:] + variants[:shift]:
            print(f"  round {r + 1} {v}: 1-min load at start {os.getloadavg()[0]:.2f}",
                  file=sys.stderr)
            res = one(v, args.n, args.gap_ms)
            raw[v].append(res)
            print(f"  round {r + 1} {v}: pickup p50 {res['pickup_p50']:.3f} ms, p99 "
                  f"{res['pickup_p99']:.2f}, raw p50 {res['raw_p50']:.3f} "
                  f"({res['started']}/{res['n']} started)", file=sys.stderr)
    print("\nmedians over rounds, ms\n")
    print("| variant | pickup p50 | pickup p99 | raw query p50 (same run) | pickup p50 / raw |")
    print("|---|---|---|---|---|")
    for v in variants:
        med = {k: statistics.median(x[k] for x in raw[v])
               for k in ("pickup_p50", "pickup_p99", "raw_p50")}
        print(f"| {v} | {med['pickup_p50']:.3f} | {med['pickup_p99']:.2f} | "
              f"{med['raw_p50']:.3f} | {med['pickup_p50'] / med['raw_p50']:.2f}x |")
    out = BENCH / "results" / f"pickup-{time.strftime('%Y-%m-%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"raw": raw, "loadavg_before": load,
                               "loadavg_after": os.getloadavg()}, indent=1) + "\n")
    print(f"\n1-min load {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after; rounds in {out}")


if __name__ == "__main__":
    main(sys.argv)
