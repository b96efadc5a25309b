"""Perf check (not a test): plain ``LiveQueue`` calls made ON the loop that serves the owner (a
notebook's ``await app.start()`` then ``q.stats()``), against the ``a``-twins, and the wall
time of one ``istos stats`` CLI run (mostly interpreter start-up).

Run: ``.venv/bin/python bench/attach_same_loop.py [--jobs 10000] [--calls 50]``. Prints
figures, asserts nothing. Target: plain calls answer in < 1 s (the issue's bar); typical is a
few milliseconds. Private loopback Zenoh mesh.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import percentile, unique_prefix, zenoh_configs  # noqa: E402


def timed_ms(fn: Any, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        fn()
        out.append((time.perf_counter() - started) * 1000)
    return out


async def atimed_ms(make: Any, calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        await make()
        out.append((time.perf_counter() - started) * 1000)
    return out


def show(name: str, ms: list[float]) -> None:
    print(f"{name:<34} median {statistics.median(ms):7.2f} ms   p95 {percentile(ms, 95):7.2f} ms"
          f"   max {max(ms):7.2f} ms   {'ok' if max(ms) < 1000 else 'NO (> 1 s)'}")


async def main(jobs: int, calls: int) -> None:
    from istos import Istos
    from istos_nb import attach

    configs, prefix = zenoh_configs(3), unique_prefix()
    app = Istos(zenoh=configs[0], prefix=prefix, node_id="bench-owner")
    app.queue("q")
    await app.start()
    try:
        for i in range(jobs):
            await app.enqueue("q", {"i": i})
        q = attach("q", configs[1], prefix=prefix)  # a plain call on the owner's loop
        try:
            show("plain stats()", timed_ms(q.stats, calls))
            show("plain jobs(limit=100)", timed_ms(lambda: q.jobs(limit=100), calls))
            show("plain why(job)", timed_ms(lambda: q.why("nope"), calls))
            show("await astats()", await atimed_ms(q.astats, calls))
            show("await ajobs(limit=100)", await atimed_ms(lambda: q.ajobs(limit=100), calls))
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            cli_ms = []
            for _ in range(3):
                started = time.perf_counter()
                await asyncio.to_thread(
                    subprocess.run, [sys.executable, "-m", "istos", "stats", "q", "--zenoh",
                                     json.dumps(configs[2]), "--prefix", prefix, "--json"],
                    check=True, capture_output=True, env=env, timeout=60)
                cli_ms.append((time.perf_counter() - started) * 1000)
            print(f"{'istos stats (a whole CLI run)':<34} median {statistics.median(cli_ms):7.0f}"
                  " ms (interpreter start, imports, session open)")
        finally:
            q.close()
    finally:
        await app.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=10_000)
    p.add_argument("--calls", type=int, default=50)
    a = p.parse_args()
    asyncio.run(main(a.jobs, a.calls))
