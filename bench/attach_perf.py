"""Perf check (not a test) of ``istos_nb.live.attach`` against an owner in another OS process.

Run: ``.venv/bin/python bench/attach_perf.py [--jobs 100000] [--calls 20] [--rates 2000,5000]
[--seconds 5]``. It prints figures and never asserts: a missed target shows ``NO``.

Targets:
1. ``stats()`` on a queue holding 100k jobs answers in < 100 ms (median of 20 calls through
   attach over Zenoh). The other inspection ops are timed on the same queue for context: those
   that scan the queue run on the owner's loop, which serves nothing else meanwhile.
2. The event stream keeps up with 2,000 events/s: the owner process enqueues and works jobs at
   ``rate / 3`` jobs/s (each job emits enqueued, claimed, acked) for ``--seconds`` while this
   process follows; the events received for that period are compared with the count the owner
   emitted. Received < emitted means events were lost in transit (the stream carries no
   sequence numbers, so only this comparison can tell); ``dropped`` counts window overflow.

Layout: the owner is this script re-run as ``--owner CONFIG PREFIX`` (two queues: ``perf/big``
with no worker, filled on command; ``perf/flow`` with an in-process worker of concurrency 8),
driven by JSON lines on stdin and answering ``@@ {json}`` lines. Private loopback Zenoh mesh.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import make_job, percentile, unique_prefix, zenoh_configs  # noqa: E402

BIG, FLOW = "perf/big", "perf/flow"
TAG = "@@ "


# -- the owner process ---------------------------------------------------------------------------
async def owner_main(config: dict[str, Any], prefix: str) -> None:
    from istos import Istos, JobEvent

    app = Istos(zenoh=config, prefix=prefix, node_id="perf-owner")
    app.queue(BIG)
    app.queue(FLOW)

    @app.worker(FLOW, concurrency=8)
    async def work(job: Any) -> None:
        return None

    counted = {"events": 0, "acked": 0}
    all_acked = asyncio.Event()
    target = {"acked": -1}

    def on_event(event: JobEvent) -> None:
        if event.queue == FLOW:
            counted["events"] += 1
            if event.kind == "acked":
                counted["acked"] += 1
                if counted["acked"] == target["acked"]:
                    all_acked.set()

    app.events.subscribe(on_event)

    def answer(**fields: Any) -> None:
        print(TAG + json.dumps(fields), flush=True)

    async with app.serving():
        answer(ready=True)
        while True:
            line = await asyncio.to_thread(sys.stdin.readline)
            cmd = json.loads(line) if line.strip() else {"cmd": "quit"}
            if cmd["cmd"] == "quit":
                return
            if cmd["cmd"] == "fill":
                start = time.perf_counter()
                for i in range(cmd["n"]):
                    await app.enqueue(BIG, {**make_job(i), "user": {"id": i % 1000}})
                answer(filled=cmd["n"], seconds=time.perf_counter() - start)
            elif cmd["cmd"] == "flow":
                jobs = int(cmd["jobs_per_s"] * cmd["seconds"])
                counted.update(events=0, acked=0)
                target["acked"] = jobs
                all_acked.clear()
                loop, t0 = asyncio.get_running_loop(), time.time()
                start, sent = loop.time(), 0
                while sent < jobs:  # paced: as many as are due by now, then yield ~5 ms
                    due = min(jobs, int((loop.time() - start) * cmd["jobs_per_s"]) + 1)
                    while sent < due:
                        await app.enqueue(FLOW, make_job(sent))
                        sent += 1
                    await asyncio.sleep(0.005)
                produced = loop.time() - start
                try:
                    await asyncio.wait_for(all_acked.wait(), 60)
                except asyncio.TimeoutError:
                    pass
                answer(jobs=jobs, acked=counted["acked"], emitted=counted["events"], t0=t0,
                       t1=time.time(), produce_s=produced, total_s=loop.time() - start)


# -- the measuring side --------------------------------------------------------------------------
class Owner:
    """The owner child process and its command line."""

    def __init__(self, config: dict[str, Any], prefix: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--owner", json.dumps(config), prefix], text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=str(ROOT))
        self.read()  # ready

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("the owner process exited")
            if line.startswith(TAG):
                return dict(json.loads(line[len(TAG):]))

    def send(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        try:
            self.send(cmd="quit")
            self.proc.wait(10)
        except Exception:
            self.proc.kill()


def timed(fn: Any, calls: int) -> tuple[float, float, float]:
    """Median, p90 and max of ``calls`` calls, in milliseconds."""
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), percentile(samples, 90), max(samples)


def stats_target(owner: Owner, config: dict[str, Any], prefix: str, jobs: int,
                 calls: int) -> None:
    from istos_nb import attach

    owner.send(cmd="fill", n=jobs)
    filled = owner.read()
    print(f"filled {BIG} with {filled['filled']:,} jobs in {filled['seconds']:.1f} s")
    with attach(BIG, config, prefix=prefix, timeout_s=30) as lq:
        ready = lq.stats()["counts"]["ready"]
        last_id = lq.jobs(offset=jobs - 1, limit=1).job_id[0]
        ops: list[tuple[str, Any, int, float | None]] = [
            ("stats()", lq.stats, calls, 100.0),
            ("jobs(limit=100)", lambda: lq.jobs(limit=100), calls, None),
            ("jobs(state='leased') [none]", lambda: lq.jobs(state="leased"), 5, None),
            ("jobs(where={'user.id': 7}) [100 hits]",
             lambda: lq.jobs(where={"user.id": 7}), 5, None),
            ("jobs(where={'user.id': -1}) [0 hits]",
             lambda: lq.jobs(where={"user.id": -1}), 5, None),
            ("why(last ready job)", lambda: lq.why(last_id), 5, None),
            ("leases()", lq.leases, calls, None),
            ("events(1000)", lambda: lq.events(1000), calls, None),
            ("  of which the `events` request alone",
             lambda: lq._call("events", limit=1000), calls, None),
            ("dead_letters() [none]", lq.dead_letters, calls, None),
        ]
        print(f"\n1. inspection of a queue holding {ready:,} ready jobs (ms; median, p90, max)")
        for name, fn, n, target in ops:
            med, p90, worst = timed(fn, n)
            verdict = "" if target is None else (
                f"  target < {target:g} ms: {'ok' if med < target else 'NO'}")
            print(f"  {name:<40} {med:8.1f} {p90:8.1f} {worst:8.1f}   (n={n}){verdict}")
        # A scan runs on the owner's loop: meanwhile the owner answers nobody (claims, acks,
        # enqueues included). Show it with stats() sampled from another thread during a scan.
        during: list[float] = []
        scan = threading.Thread(target=lambda: lq.jobs(where={"user.id": -1}))
        scan.start()
        while scan.is_alive():
            start = time.perf_counter()
            lq.stats()
            during.append((time.perf_counter() - start) * 1e3)
        scan.join()
        print(f"  stats() while a where-scan runs: max {max(during):.0f} ms over "
              f"{len(during)} calls (the owner's loop is blocked by the scan)")


def stream_target(owner: Owner, config: dict[str, Any], prefix: str, rates: list[int],
                  seconds: float) -> None:
    from istos_nb import attach

    print(f"\n2. event stream while following {FLOW} ({seconds:g} s per rate)")
    with attach(FLOW, config, prefix=prefix, timeout_s=10) as lq:
        lq.follow(window=1_000_000)
        for rate in rates:
            stats_ms: list[float] = []
            done = threading.Event()
            result: dict[str, Any] = {}

            def wait_reply(out: dict[str, Any] = result, flag: threading.Event = done) -> None:
                out.update(owner.read())
                flag.set()

            before = lq.stream_stats["received"]
            owner.send(cmd="flow", jobs_per_s=rate / 3, seconds=seconds)
            threading.Thread(target=wait_reply, daemon=True).start()
            while not done.wait(0.1):  # sample stats() latency under load meanwhile
                start = time.perf_counter()
                lq.stats()
                stats_ms.append((time.perf_counter() - start) * 1e3)
            t_done = time.perf_counter()
            t0, t1, emitted = result["t0"], result["t1"], result["emitted"]
            # The stream is asynchronous: poll the cheap counter until it has caught up (or
            # stalled for 1 s), then count the events the owner stamped within the run.
            last_change, last = time.perf_counter(), -1
            while time.perf_counter() - last_change < 1.0 and time.perf_counter() - t_done < 15:
                got = lq.stream_stats["received"] - before
                if got != last:
                    last, last_change = got, time.perf_counter()
                if got >= emitted:
                    break
                time.sleep(0.002)
            caught_up_ms = (time.perf_counter() - t_done) * 1e3
            df = lq.events(limit=1_000_000)
            received = int(((df.t >= t0) & (df.t <= t1)).sum())
            achieved = emitted / result["total_s"]
            ok = "ok" if received >= emitted and achieved >= 0.95 * rate else "NO"
            st = lq.stream_stats
            print(f"  target {rate:>6,} ev/s: owner emitted {emitted:,} events "
                  f"({achieved:,.0f} ev/s achieved; {result['acked']:,}/{result['jobs']:,} "
                  f"jobs acked), received {received:,}, lost {emitted - received:,}, "
                  f"window dropped {st['dropped']:,}; stream caught up "
                  f"{caught_up_ms:.0f} ms after the owner finished; stats() under load "
                  f"median {statistics.median(stats_ms) if stats_ms else float('nan'):.1f} ms  "
                  f"[{ok}]")
        st = lq.stream_stats
        print(f"  stream totals: received {st['received']:,} in {st['batches']:,} batches "
              f"({st['received'] / max(1, st['batches']):.1f} events/batch), duplicates "
              f"{st['duplicates']}, renewals {st['renewals']}, renewal errors "
              f"{st['renew_errors']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rates", default="2000,5000")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--owner", nargs=2, metavar=("CONFIG", "PREFIX"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.owner:
        asyncio.run(owner_main(json.loads(args.owner[0]), args.owner[1]))
        return
    configs, prefix = zenoh_configs(2), unique_prefix()
    owner = Owner(configs[0], prefix)
    try:
        stats_target(owner, configs[1], prefix, args.jobs, args.calls)
        stream_target(owner, configs[1], prefix, [int(r) for r in args.rates.split(",")],
                      args.seconds)
    finally:
        owner.close()


if __name__ == "__main__":
    main()
