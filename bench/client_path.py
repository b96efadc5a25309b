"""The producer's side of one awaited enqueue: where its time goes, owner in-process or remote.

    .venv/bin/python -m bench.client_path [--rounds 3] [--n 2000] [--profile] [--uvloop]

The producer (this process) awaits ``--n`` enqueues one at a time, after 200 warm-up calls, in
each of these setups, interleaved round by round (order rotated):

- ``remote``: the owner in another process (an Istos app on a private loopback mesh);
- ``local``: the owner in this process (the call goes straight to its dispatch);
- ``ping``, ``transport``: to the remote owner, ``OwnerClient.call("ping")`` and a bare
  ``ZenohTransport.query`` of the same key: the layers under ``remote``;
- ``transport get``, ``remote get``: ``transport`` and ``remote`` with the transport's
  ``use_queriers`` off (each query through ``Session.get`` rather than a declared Querier):
  an A/B of the querier in the same run.

Per setup: p50 / mean microseconds per call and the event-loop iterations per call (a loop
iteration is one pass of ``select`` and the ready callbacks: each hop between threads or tasks
costs one). Every figure is also shown as a ratio to ``transport`` of the same round (the
remote ones) or as is (local). ``--profile``: one cProfile run of ``remote`` afterwards, the top
functions by own time (the wait in ``epoll`` and Zenoh's ``Session.get`` included). ``--uvloop``:
uvloop in both processes (loop iterations are then not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
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

from _common import zenoh_configs  # noqa: E402

QUEUE = "bench/client"
SETUPS = ("transport", "transport get", "ping", "remote", "remote get", "local")
SESSION_GET = ("transport get", "remote get")  # use_queriers off
BODY = {"i": 0, "pad": "x" * 70}


def owner_process(cfg: dict[str, Any], prefix: str, uv: bool) -> subprocess.Popen[str]:
    code = (
        "import asyncio, json, sys\n"
        "from istos import Istos\n"
        "async def main():\n"
        "    app = Istos(zenoh=json.loads(sys.argv[1]), prefix=sys.argv[2])\n"
        f"    app.queue({QUEUE!r})\n"
        "    async with app.serving():\n"
        "        print('READY', flush=True)\n"
        "        await asyncio.to_thread(sys.stdin.readline)\n"
        + ("import uvloop; uvloop.install()\n" if uv else "")
        + "asyncio.run(main())\n")
    proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(cfg), prefix],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "READY":
        proc.kill()
        raise RuntimeError("the owner process did not start")
    return proc


class IterationCounter:
    """Counts the loop's iterations (wraps ``_run_once`` of a stock asyncio loop)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.count = 0
        inner = getattr(loop, "_run_once", None)
        if inner is None:  # uvloop: not countable
            self.count = -1
            return

        def counted() -> None:
            self.count += 1
            inner()

        loop._run_once = counted  # type: ignore[attr-defined]


async def measure(call: Any, n: int, counter: IterationCounter) -> dict[str, float]:
    for _ in range(200):
        await call()
    perf = time.perf_counter
    samples: list[float] = []
    before = counter.count
    t0 = perf()
    for _ in range(n):
        t = perf()
        await call()
        samples.append(perf() - t)
    total = perf() - t0
    iters = (counter.count - before) / n if counter.count >= 0 else float("nan")
    return {"p50_us": statistics.median(samples) * 1e6, "mean_us": total / n * 1e6,
            "iterations": iters}


async def run(args: argparse.Namespace) -> None:
    from istos import Istos, keys

    cfgs = zenoh_configs(3)
    prefix = f"istos-bench/{os.urandom(6).hex()}"
    owner = owner_process(cfgs[0], prefix, args.uvloop)
    counter = IterationCounter(asyncio.get_running_loop())
    remote = Istos(zenoh=cfgs[1], prefix=prefix)
    local = Istos(zenoh=cfgs[2], prefix=prefix + "-local")
    local.queue(QUEUE)
    rows: dict[str, list[dict[str, float]]] = {s: [] for s in SETUPS}
    try:
        async with remote.serving(), local.serving():
            client = remote.client(QUEUE)
            await client.call("ping")  # waits for the route
            transport = remote.node.transport
            assert transport is not None
            ping_key = keys.op_key(keys.rpc_base(prefix, QUEUE), "ping")
            ping_msg = b"\x82\xa1v\x01\xa2op\xa4ping"
            calls = {
                "transport": lambda: transport.query(ping_key, ping_msg, 5.0),
                "transport get": lambda: transport.query(ping_key, ping_msg, 5.0),
                "ping": lambda: client.call("ping"),
                "remote": lambda: remote.enqueue(QUEUE, BODY),
                "remote get": lambda: remote.enqueue(QUEUE, BODY),
                "local": lambda: local.enqueue(QUEUE, BODY),
            }
            for r in range(args.rounds):
                order = list(SETUPS[r % len(SETUPS):] + SETUPS[:r % len(SETUPS)])
                for name in order:
                    transport.use_queriers = name not in SESSION_GET  # type: ignore[attr-defined]
                    row = await measure(calls[name], args.n, counter)
                    rows[name].append(row)
                    print(f"  round {r + 1} {name}: p50 {row['p50_us']:.1f} us, mean "
                          f"{row['mean_us']:.1f} us, {row['iterations']:.2f} loop iterations "
                          f"per call (1-min load {os.getloadavg()[0]:.2f})", file=sys.stderr)
            print("\nmedians over rounds\n")
            print("| setup | p50 us | mean us | loop iterations per call | p50 / transport |")
            print("|---|---|---|---|---|")
            base = statistics.median(x["p50_us"] for x in rows["transport"])
            for name in SETUPS:
                med = {k: statistics.median(x[k] for x in rows[name])
                       for k in ("p50_us", "mean_us", "iterations")}
                ratio = "-" if name == "local" else f"{med['p50_us'] / base:.2f}x"
                print(f"| {name} | {med['p50_us']:.1f} | {med['mean_us']:.1f} | "
                      f"{med['iterations']:.2f} | {ratio} |")
            if args.profile:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(args.n):
                    await remote.enqueue(QUEUE, BODY)
                prof.disable()
                print("\ncProfile of the remote enqueue (own time; epoll and Session.get are "
                      "the waits)\n")
                pstats.Stats(prof).sort_stats("tottime").print_stats(20)
    finally:
        assert owner.stdin is not None
        owner.stdin.write("stop\n")
        owner.stdin.close()
        try:
            owner.wait(20)
        except subprocess.TimeoutExpired:
            owner.kill()
    print(f"1-min load at the end {os.getloadavg()[0]:.2f} (compare ratios within one run)")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.client_path")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--uvloop", action="store_true")
    args = p.parse_args(argv)
    print(f"1-min load at the start {os.getloadavg()[0]:.2f}")
    if args.uvloop:
        import uvloop

        uvloop.install()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
