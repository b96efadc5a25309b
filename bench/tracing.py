"""Perf check (not a test): what OpenTelemetry tracing costs per job, against none.

Run: ``.venv/bin/python bench/tracing.py [--jobs 3000] [--rounds 3]``. One process, one app
that owns a queue and works it (the in-process path: no mesh hop), jobs enqueued one at a time
by ``asyncio.gather`` in chunks and acked by a no-op async function. Three settings:

- ``off``: ``Istos(tracing=False)``, the engine without the extra;
- ``api-only``: tracing on through the API's no-op provider (the extra installed, no SDK);
- ``sdk``: an SDK ``TracerProvider`` whose processor drops every ended span, so the figure is
  the engine's cost of making the spans and carrying the context, not an exporter's;
- ``sdk-unsampled``: the same with a sampler that records nothing.

Prints microseconds per job (enqueue to ack, best round) and the ratio to ``off``.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import unique_prefix, zenoh_configs  # noqa: E402
from istos import Istos  # noqa: E402


def settings() -> dict[str, Any]:
    out: dict[str, Any] = {"off": False}
    try:
        from opentelemetry.trace import NoOpTracerProvider
    except ImportError:
        return out
    out["api-only"] = NoOpTracerProvider()
    try:
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
    except ImportError:
        return out

    class Drop(SpanProcessor):
        pass  # on_start / on_end do nothing: spans are made, then dropped

    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    provider = TracerProvider()
    provider.add_span_processor(Drop())
    out["sdk"] = provider
    unsampled = TracerProvider(sampler=ALWAYS_OFF)
    unsampled.add_span_processor(Drop())
    out["sdk-unsampled"] = unsampled
    return out


async def per_job_us(tracing: Any, jobs: int, rounds: int) -> float:
    app = Istos(zenoh=zenoh_configs(1)[0], prefix=unique_prefix(), tracing=tracing)
    app.queue("bench", lease_s=60)
    done = asyncio.Event()
    acked = 0
    target = 0

    @app.worker("bench", concurrency=32)
    async def work(data: Any) -> None:
        nonlocal acked
        acked += 1
        if acked >= target:
            done.set()

    best = float("inf")
    async with app.serving():
        for _ in range(rounds + 1):  # the first round warms up
            done.clear()
            target = acked + jobs
            start = time.perf_counter()
            for chunk in range(0, jobs, 100):
                await asyncio.gather(*(app.enqueue("bench", i)
                                       for i in range(chunk, min(jobs, chunk + 100))))
            await asyncio.wait_for(done.wait(), 120)
            best = min(best, (time.perf_counter() - start) / jobs * 1e6)
    return best


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base = None
    print(f"{'tracing':10} {'us/job':>8} {'ratio':>6}")
    for name, option in settings().items():
        us = await per_job_us(option, args.jobs, args.rounds)
        base = base or us
        print(f"{name:10} {us:8.1f} {us / base:6.2f}")


if __name__ == "__main__":
    asyncio.run(main())
