"""Claim+ack latency while read ops hammer a deep queue's owner.

An owner (its own process) holds ``--jobs`` ready jobs (default 100,000). A closed-loop client
claims one job and acks it, over and over, for ``--seconds`` per case, and reports the p50 and
p99 of claim+ack; in each case but the first, two closed-loop readers (another process) send
one read op as fast as it is answered: ``jobs`` without a filter at a large offset, ``jobs`` by
state, ``why`` of the newest ready job, ``resolve`` with no match, ``events`` and
``events_since`` with limit 5,000, ``workers``, ``leases``. Read ops walk their records in 4 ms
slices (``istos/owner/views/slicing.py``), so the p99 should stay within a few slices of the idle
one.

    .venv/bin/python -m bench.read_ops [--jobs 100000] [--seconds 5] [--gc-freeze off|on|ab]
        [--only why,events]

Beside the latency, the owner reports the CPU time of its loop steps (p99 and longest) and of
its full cyclic-GC passes during each case (``bench/_loopmeter.py``): those say how long the owner
itself held the loop, whatever else shared the cores.

``--gc-freeze ab`` runs each case twice, the second time after the owner called
``gc.collect(); gc.freeze()`` (rows marked F): the held records leave the cyclic GC's full
passes (see docs/event-loop.md). At the end, the owner times one full collection as it is
and one after ``gc.freeze()``.

Measure on an idle machine (1-min load < 1): two busy processes share the cores with the owner.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import subprocess
import sys
import time
from typing import Any

from bench._common import percentile, unique_prefix, zenoh_configs
from bench._loopmeter import LoopMeter
from istos import Istos, codec
from istos.transport.zenoh import ZenohTransport

COMMANDS = ("take", "freeze", "thaw", "probe")

CASES: list[tuple[str, dict[str, Any]]] = [
    ("(none)", {}),
    ("jobs", {"offset": 90_000, "limit": 10}),
    ("jobs", {"state": "ready", "offset": 90_000, "limit": 10}),
    ("why", {"job_id": "LAST"}),
    ("resolve", {"prefix": "zzzzzzzz"}),
    ("events", {"limit": 5000}),
    ("events_since", {"after": 0, "limit": 5000}),
    ("workers", {}),
    ("leases", {"offset": 50_000}),
]


async def call(t: ZenohTransport, prefix: str, role: str, msg: dict[str, Any]) -> Any:
    raw = await t.query(f"{prefix}/q/q/rpc/{role}", codec.encode_message({"v": 1, **msg}), 30.0)
    return codec.decode_message(raw)


async def owner(config: dict[str, Any], prefix: str, jobs: int) -> None:
    app = Istos(zenoh=config, prefix=prefix, node_id="owner")
    app.queue("q", lease_s=600.0)
    async with app.serving():
        for start in range(0, jobs, 4000):
            n = min(4000, jobs - start)
            await app.enqueue_many("q", [{"i": i} for i in range(start, start + n)],
                                   job_ids=[f"job-{i:07d}" for i in range(start, start + n)])
        meter = LoopMeter()
        meter.install()
        print("READY", flush=True)
        # "take" answers the loop's figures since the last take; "freeze" / "thaw" move the
        # objects held now out of the cyclic GC's walks and back; anything else ends it
        while (line := (await asyncio.to_thread(sys.stdin.readline)).strip()) in COMMANDS:
            if line == "freeze":
                gc.collect()  # (what is garbage now would never be collected once frozen)
                gc.freeze()
            elif line == "thaw":
                gc.unfreeze()
            elif line == "probe":  # one full collection as things are, and one frozen
                gc.unfreeze()
                t0 = time.thread_time()
                gc.collect()
                held = time.thread_time() - t0
                gc.freeze()
                t0 = time.thread_time()
                gc.collect()
                frozen = time.thread_time() - t0
                gc.unfreeze()
                print(json.dumps({"full_gc_ms": held * 1e3, "frozen_full_gc_ms": frozen * 1e3,
                                  "tracked": len(gc.get_objects())}), flush=True)
                continue
            await asyncio.sleep(0)  # this step (the collection's) ends before the take
            print(json.dumps(meter.take()), flush=True)


def take(proc: subprocess.Popen[str], command: str = "take") -> dict[str, Any]:
    """The owner's loop figures since the last take (see bench/_loopmeter.py), after
    ``command`` (one of :data:`COMMANDS`)."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{command}\n")
    proc.stdin.flush()
    figures: dict[str, Any] = json.loads(proc.stdout.readline())
    return figures


async def readers(config: dict[str, Any], prefix: str, op: str, fields: dict[str, Any]) -> None:
    t = ZenohTransport(config, node_id="reader")
    await t.start()

    async def loop() -> None:
        while True:
            await call(t, prefix, "read", {"op": op, **fields})

    print("READY", flush=True)
    tasks = [asyncio.create_task(loop()) for _ in range(2)]
    await asyncio.to_thread(sys.stdin.readline)
    for task in tasks:
        task.cancel()
    await t.close()


def spawn(*args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "bench.read_ops", *args], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env=dict(os.environ))
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "READY", line
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    try:
        assert proc.stdin is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        proc.wait(30)
    except Exception:
        proc.kill()
        proc.wait(10)


async def claim_ack(t: ZenohTransport, prefix: str, seconds: float) -> list[float]:
    samples: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        reply = await call(t, prefix, "work", {"op": "claim", "workers": ["bench:c#0"],
                                                "node": "bench"})
        job = reply["jobs"][0]
        await call(t, prefix, "work", {"op": "settle", "items": [
            {"op": "ack", "job_id": job["job_id"], "token": job["token"]}]})
        samples.append(time.perf_counter() - t0)
    return samples


async def main(args: argparse.Namespace) -> None:
    configs, prefix = zenoh_configs(3), unique_prefix()
    configs[2]["listen"] = {"endpoints": []}  # the readers only connect: spawned once per case
    own = spawn("--role", "owner", json.dumps(configs[0]), prefix, str(args.jobs))
    t = ZenohTransport(configs[1], node_id="bench")
    await t.start()
    try:
        last = f"job-{args.jobs - 1:07d}"
        print(f"(1-min load at the start: {os.getloadavg()[0]:.2f})")
        print(f"{'op':<14} {'fields':<42} {'claim+ack p50':>14} {'p99':>10} {'n':>7} "
              f"{'step p99':>9} {'step max':>9} {'full GCs':>8} {'GC max':>8}")
        modes = {"off": ["thaw"], "on": ["freeze"], "ab": ["thaw", "freeze"]}[args.gc_freeze]
        for op, fields in CASES:
            if args.only and op not in ("(none)", *args.only.split(",")):
                continue
            fields = {k: (last if v == "LAST" else v) for k, v in fields.items()}
            for mode in modes:
                reader = None if op == "(none)" else spawn(
                    "--role", "readers", json.dumps(configs[2]), prefix, op, json.dumps(fields))
                take(own, mode)
                try:
                    samples = await claim_ack(t, prefix, args.seconds)
                finally:
                    loop = take(own)
                    if reader is not None:
                        stop(reader)
                ms = [s * 1000 for s in samples]
                label = op if len(modes) == 1 else f"{op} {'F' if mode == 'freeze' else '-'}"
                print(f"{label:<14} {json.dumps(fields)[:42]:<42} {percentile(ms, 50):>11.2f} ms "
                      f"{percentile(ms, 99):>7.2f} ms {len(ms):>7} "
                      f"{loop['step_p99_ms']:>6.2f} ms {loop['step_max_ms']:>6.2f} ms "
                      f"{loop['full_gcs']:>8} {loop['full_gc_max_ms']:>5.1f} ms", flush=True)
        probe = take(own, "probe")
        print(f"one full GC in the owner ({probe['tracked']:,} objects tracked): "
              f"{probe['full_gc_ms']:.1f} ms of CPU; after gc.freeze(): "
              f"{probe['frozen_full_gc_ms']:.3f} ms")
    finally:
        await t.close()
        stop(own)
    print(f"(1-min load at the end: {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--only", default="", help="comma-separated ops to run (and the case "
                                                     "without readers); default: every case")
    parser.add_argument("--gc-freeze", choices=("off", "on", "ab"), default="off",
                        help="gc.freeze() the owner's objects before each case (on), or run "
                             "each case without and then with it (ab; F marks frozen rows)")
    parser.add_argument("--role", default="main")
    parser.add_argument("rest", nargs="*")
    ns = parser.parse_args()
    if ns.role == "owner":
        asyncio.run(owner(json.loads(ns.rest[0]), ns.rest[1], int(ns.rest[2])))
    elif ns.role == "readers":
        asyncio.run(readers(json.loads(ns.rest[0]), ns.rest[1], ns.rest[2],
                            json.loads(ns.rest[3])))
    else:
        asyncio.run(main(ns))
