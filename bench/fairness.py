"""Perf check (not a test): is the owner fair to other clients while someone abuses it?

Run: ``.venv/bin/python -m bench.fairness [--jobs 100000] [--seconds 3]``. Prints figures and
never asserts; a missed target shows ``NO``.

The owner is this module re-run as ``--owner CONFIG PREFIX`` in its own OS process, holding
``fair/big`` (``--jobs`` ready jobs) and ``fair/work`` (jobs for claims). This process, over a
private loopback Zenoh mesh, measures the round trip of ``stats`` and of ``claim`` + ``ack``:

1. alone (the baseline);
2. while another client runs payload searches back to back over ``fair/big``, the heaviest the
   protocol admits (16 keys of 16-part paths, no hit: every body decoded);
3. pickup time (enqueue to start) of a real worker on the empty queue ``fair/idle``, alone and
   with 64 empty claims from new node ids sent before each job (each fake asks to be nudged,
   and is more recently hungry than the real worker); the worker polls only every 5 s, so a
   pickup within ms is the nudge's doing.

Target (issue 11): a concurrent stats/claim waits < 20 ms more than alone, at the p99, during
the search; the owner's memory of hungry nodes stays bounded (printed by the owner).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import percentile, unique_prefix, zenoh_configs  # noqa: E402

BIG, WORK, IDLE = "fair/big", "fair/work", "fair/idle"
TAG = "@@ "
HEAVY_WHERE = {".".join(f"p{k}{i}" for i in range(16)): -1 for k in range(16)}


async def owner_main(config: dict[str, Any], prefix: str, jobs: int) -> None:
    from istos import Istos

    app = Istos(zenoh=config, prefix=prefix, node_id="fair-owner")
    app.queue(BIG)
    app.queue(WORK, lease_s=600)
    app.queue(IDLE)
    async with app.serving():
        for i in range(jobs):
            await app.enqueue(BIG, {"i": i, "user": {"id": i % 1000}, "pad": "x" * 64})
        for i in range(20_000):
            await app.enqueue(WORK, {"i": i})
        print(TAG + json.dumps({"ready": True}), flush=True)
        owner = app.owners[IDLE]
        while True:
            line = await asyncio.to_thread(sys.stdin.readline)
            if not line.strip():
                return
            # (an engine from before the bounded tables has a plain dict instead)
            hungry = getattr(owner, "hungry", None) or getattr(owner, "_hungry", {})
            print(TAG + json.dumps({"hungry": len(hungry)}), flush=True)


async def pickups(config: dict[str, Any], prefix: str, seconds: float, abuse: Any,
                  name: str) -> list[float]:
    """Enqueue to start of a real worker's jobs, in ms, one job every 20 ms."""
    from istos import Istos

    app = Istos(zenoh=config, prefix=prefix, node_id=f"real-worker-{name.replace(' ', '-')}")
    got: asyncio.Queue[float] = asyncio.Queue()

    @app.worker(IDLE, poll_interval_s=5.0)
    async def work(job: dict[str, Any]) -> None:
        got.put_nowait((time.perf_counter() - job["t"]) * 1e3)

    out: list[float] = []
    async with app.serving():
        await app.enqueue(IDLE, {"t": time.perf_counter()})  # routes up; the worker is known
        await asyncio.wait_for(got.get(), 30)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            if abuse is not None:
                await abuse()  # fresh fakes ask to be nudged, after the real worker did
                await asyncio.sleep(0.005)  # and the real worker's poll-free wait begins
            await app.enqueue(IDLE, {"t": time.perf_counter()})
            try:
                out.append(await asyncio.wait_for(got.get(), 30))
            except asyncio.TimeoutError:
                print(f"  {name}: a job was not picked up in 30 s; worker stats "
                      f"{app.runners[0].stats}", flush=True)
                raise
            await asyncio.sleep(0.02)
    return out


async def measure(config: dict[str, Any], worker_config: dict[str, Any], prefix: str,
                  seconds: float) -> None:
    from istos import codec, keys
    from istos.transport.zenoh import ZenohTransport

    transport = ZenohTransport(config, node_id="fair-client")
    await transport.start()

    async def call(queue: str, **msg: Any) -> dict[str, Any]:
        raw = await transport.query(keys.rpc_key(prefix, queue, msg["op"]),
                                    codec.encode_message({"v": 1, **msg}), 60.0)
        return codec.decode_message(raw)

    for _ in range(200):  # route discovery
        try:
            await call(WORK, op="ping")
            break
        except Exception:
            await asyncio.sleep(0.05)

    async def sample(stop: asyncio.Event) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {"stats": [], "claim+ack": []}
        n = 0
        while not stop.is_set():
            t0 = time.perf_counter()
            await call(BIG, op="stats")
            out["stats"].append((time.perf_counter() - t0) * 1e3)
            t0 = time.perf_counter()
            got = await call(WORK, op="claim", workers=["w#0"], node="real-worker")
            for job in got["jobs"]:
                await call(WORK, op="ack", job_id=job["job_id"], token=job["token"])
            out["claim+ack"].append((time.perf_counter() - t0) * 1e3)
            n += 1
            await asyncio.sleep(0.002)
        return out

    async def run(abuse: Any) -> tuple[dict[str, list[float]], int]:
        stop = asyncio.Event()
        count = [0]
        task = asyncio.get_running_loop().create_task(sample(stop))
        abuser = asyncio.get_running_loop().create_task(abuse(stop, count)) if abuse else None
        await asyncio.sleep(seconds)
        stop.set()
        if abuser is not None:
            await abuser
        return await task, count[0]

    async def searches(stop: asyncio.Event, count: list[int]) -> None:
        while not stop.is_set():
            reply = await call(BIG, op="jobs", where=HEAVY_WHERE, limit=10)
            assert reply["ok"], reply
            count[0] += 1

    fakes = [0]

    async def fake_claims() -> None:
        await asyncio.gather(*(call(IDLE, op="claim", workers=["s0", "s1"],
                                    node=f"fake-{fakes[0] + k}") for k in range(64)))
        fakes[0] += 64

    results: dict[str, tuple[dict[str, list[float]], int]] = {}
    for name, abuse in (("alone", None), ("during where-search", searches)):
        results[name] = await run(abuse)
    picked = {name: await pickups(worker_config, prefix, seconds, abuse, name)
              for name, abuse in (("alone", None), ("during fake claims", fake_claims))}
    await transport.close()
    base = {op: percentile(v, 99) for op, v in results["alone"][0].items()}
    print(f"round trips in ms (p50 / p99 / max), {seconds:g} s each")
    for name, (samples, count) in results.items():
        for op, values in samples.items():
            p99 = percentile(values, 99)
            extra = p99 - base[op]
            verdict = "" if name == "alone" else \
                f"  +{extra:.1f} ms at p99; target < 20: {'ok' if extra < 20 else 'NO'}"
            print(f"  {name:<22} {op:<10} {percentile(values, 50):6.1f} {p99:6.1f} "
                  f"{max(values):6.1f}  (n={len(values)}){verdict}")
        if count:
            print(f"  {'':<22} abuser requests: {count}")
    print("pickup of a real worker on an empty queue, enqueue to start, ms (p50 / p99 / max)")
    for name, values in picked.items():
        print(f"  {name:<22} {percentile(values, 50):6.1f} {percentile(values, 99):6.1f} "
              f"{max(values):6.1f}  (n={len(values)})")
    print(f"  fake claims sent: {fakes[0]} from as many node ids")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--owner", nargs=2)
    args = parser.parse_args()
    if args.owner:
        asyncio.run(owner_main(json.loads(args.owner[0]), args.owner[1], args.jobs))
        return
    configs, prefix = zenoh_configs(3), unique_prefix()
    proc = subprocess.Popen([sys.executable, "-m", "bench.fairness", "--jobs", str(args.jobs),
                             "--owner", json.dumps(configs[0]), prefix],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=str(ROOT))
    assert proc.stdout is not None and proc.stdin is not None
    try:
        t0 = time.perf_counter()
        line = proc.stdout.readline()
        assert line.startswith(TAG), line
        print(f"owner filled {args.jobs:,} jobs in {time.perf_counter() - t0:.1f} s")
        asyncio.run(measure(configs[1], configs[2], prefix, args.seconds))
        proc.stdin.write("hungry\n")
        proc.stdin.flush()
        print(f"  owner remembers {json.loads(proc.stdout.readline()[len(TAG):])['hungry']} "
              "hungry nodes after the fake claims (bounded)")
    finally:
        proc.kill()
        proc.wait(10)


if __name__ == "__main__":
    main()
