"""One write-through to Redis, as the owner's persister makes it: the adapter's call overhead.

    .venv/bin/python -m bench.redis_write [--rounds 5] [--n 3000]

Times ``--n`` sequential ``RedisStoragePlugin.apply`` calls of one ~120-byte record (the
unfenced group commit of one enqueue) against Redis at 127.0.0.1:6379, in three variants
interleaved round by round (order rotated), each under its own random key prefix (wiped):

- ``adapter``: the adapter as it is (its whole-call deadline by ``asyncio.timeout`` in a Task);
- ``wait_for``: the same with the deadline by ``asyncio.wait_for`` (an extra Task per call
  before Python 3.12: what the adapter does outside any Task);
- ``no deadline``: the adapter's call with no whole-call deadline (the floor; not safe).

Prints each round's p50 with the 1-min load, then the medians and each as a ratio to
``wait_for`` (the machine may be shared: read the ratios).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from istos import RedisStoragePlugin
from istos.errors import StorageUnavailable

T = TypeVar("T")
URL = "redis://127.0.0.1:6379/0"


class WaitFor(RedisStoragePlugin):
    async def _call(self, op: str, fn: Callable[[Any], Awaitable[T]]) -> T:
        from redis.exceptions import RedisError

        try:
            return await asyncio.wait_for(fn(self._ensure_client()), self._deadline_s)
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            raise StorageUnavailable(f"{op}: {exc}") from exc


class NoDeadline(RedisStoragePlugin):
    async def _call(self, op: str, fn: Callable[[Any], Awaitable[T]]) -> T:
        return await fn(self._ensure_client())


async def run(rounds: int, n: int) -> None:
    stores: dict[str, RedisStoragePlugin] = {
        name: cls(URL, key_prefix=f"istos-bench-{secrets.token_hex(6)}")
        for name, cls in (("adapter", RedisStoragePlugin), ("wait_for", WaitFor),
                          ("no deadline", NoDeadline))}
    for store in stores.values():
        await store.open()
    p50s: dict[str, list[float]] = {name: [] for name in stores}
    value = b"x" * 120
    perf = time.perf_counter
    try:
        for r in range(rounds):
            names = list(stores)
            for name in names[r % 3:] + names[:r % 3]:
                store, samples = stores[name], []
                for i in range(n):
                    t = perf()
                    await store.apply("ns", [(f"j{i}", value)], [])
                    samples.append(perf() - t)
                p50s[name].append(statistics.median(samples) * 1e6)
                print(f"  round {r + 1} {name}: p50 {p50s[name][-1]:.1f} us "
                      f"(1-min load {os.getloadavg()[0]:.2f})")
    finally:
        for store in stores.values():
            await store.wipe()
            await store.close()
    base = statistics.median(p50s["wait_for"])
    print("\n| variant | p50 us (median of rounds) | / wait_for |\n|---|---|---|")
    for name, xs in p50s.items():
        med = statistics.median(xs)
        print(f"| {name} | {med:.1f} | {med / base:.2f}x |")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.redis_write")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--n", type=int, default=3000)
    args = p.parse_args()
    print(f"1-min load at the start {os.getloadavg()[0]:.2f}")
    asyncio.run(run(args.rounds, args.n))
    print(f"1-min load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
