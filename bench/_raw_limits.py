"""The raw limits under the peer table: zenoh-python and Redis with no framework on top.

    .venv/bin/python bench/_raw_limits.py [--rounds 5] [--n 3000] [--table]

Zenoh (two processes on a private loopback mesh; the server is this script in ``server``
mode, with a queryable that echoes and a subscriber that counts):

- ``sequential``: one ``session.get`` at a time, the reply read from Zenoh's default channel
  (p50 ms and queries/s): back to back, so every thread on the path is already awake;
- ``spaced``: the same, one query every ``GAP_S`` (5 ms, the pickup phase's spacing of
  ``bench.peers``): each query wakes idle threads on both sides, as an idle worker's pickup
  does, so this is the round trip a pickup is compared with;
- ``inflight64``: 64 gets in flight (callback handlers, a semaphore refills as they finish);
- ``put->sub``: 100-byte puts through a declared publisher; messages/s as the subscriber counts
  them, first to last.

Redis: sequential ``LPUSH`` of 100 bytes on a key of its own (deleted afterwards), redis-py.
Medians over ``--rounds`` rounds; ``--table`` prints one ``@@RESULT`` line for ``bench.peers``.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import zenoh

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import percentile, zenoh_configs  # noqa: E402

RESULT_TAG = "@@RESULT "
PAYLOAD = b"x" * 100


def open_session(cfg: dict[str, Any]) -> zenoh.Session:
    return zenoh.open(zenoh.Config.from_json5(json.dumps(cfg)))


def serve(cfg: dict[str, Any], key: str) -> None:
    """The server process: echo queries on ``key/q``, count samples on ``key/s``."""
    session = open_session(cfg)
    state = {"n": 0, "first": 0.0, "last": 0.0}

    def on_query(query: zenoh.Query) -> None:
        payload = query.payload
        query.reply(query.key_expr, payload.to_bytes() if payload is not None else b"")

    def on_sample(sample: zenoh.Sample) -> None:
        now = time.perf_counter()
        if state["n"] == 0:
            state["first"] = now
        state["n"] += 1
        state["last"] = now

    qable = session.declare_queryable(f"{key}/q", on_query)
    sub = session.declare_subscriber(f"{key}/s", on_sample)
    print("@@READY", flush=True)
    for line in sys.stdin:  # "count" -> report and reset the subscriber's figures; EOF ends
        if line.strip() == "count":
            print(json.dumps(state), flush=True)
            state.update(n=0, first=0.0, last=0.0)
    qable.undeclare()
    sub.undeclare()
    session.close()


def wait_route(session: zenoh.Session, key: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if any(r.ok is not None for r in session.get(key, payload=b"ping", timeout=1.0)):
            return
        time.sleep(0.01)
    raise TimeoutError("the server's queryable never answered")


def sequential(session: zenoh.Session, key: str, n: int) -> dict[str, float]:
    samples = []
    t0 = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        for reply in session.get(key, payload=PAYLOAD):
            assert reply.ok is not None
        samples.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - t0
    ms = [s * 1e3 for s in samples]
    return {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99), "per_s": n / elapsed}


GAP_S = 0.005
SPACED_N = 200


def spaced(session: zenoh.Session, key: str, n: int) -> float:
    """p50 ms of ``n`` single queries, ``GAP_S`` apart (idle threads woken by each)."""
    samples = []
    for _ in range(n):
        time.sleep(GAP_S)  # (a bench: lets both sides go idle)
        t = time.perf_counter()
        for reply in session.get(key, payload=PAYLOAD):
            assert reply.ok is not None
        samples.append(time.perf_counter() - t)
    return percentile([s * 1e3 for s in samples], 50)


def inflight(session: zenoh.Session, key: str, n: int, depth: int = 64) -> float:
    slots = threading.Semaphore(depth)
    done = threading.Event()
    count = [0]
    lock = threading.Lock()

    def on_done() -> None:
        slots.release()
        with lock:
            count[0] += 1
            if count[0] == n:
                done.set()

    t0 = time.perf_counter()
    for _ in range(n):
        slots.acquire()
        session.get(key, zenoh.handlers.Callback(lambda r: None, on_done, indirect=False),
                    payload=PAYLOAD)
    if not done.wait(60):
        raise TimeoutError(f"only {count[0]} of {n} in-flight queries finished")
    return n / (time.perf_counter() - t0)


def put_sub(session: zenoh.Session, key: str, server: subprocess.Popen[str], n: int
            ) -> float:
    pub = session.declare_publisher(key)
    for _ in range(n):
        pub.put(PAYLOAD)
    time.sleep(0.5)  # let the tail arrive; the rate is taken first to last sample
    assert server.stdin is not None and server.stdout is not None
    server.stdin.write("count\n")
    server.stdin.flush()
    state = json.loads(server.stdout.readline())
    pub.undeclare()
    span = state["last"] - state["first"]
    return state["n"] / span if span > 0 else float("nan")


def zenoh_round(n: int) -> dict[str, float]:
    cfg_server, cfg_client = zenoh_configs(2)
    key = f"istos-bench/raw-{secrets.token_hex(6)}"
    server = subprocess.Popen([sys.executable, "-u", __file__, "server", json.dumps(cfg_server),
                               key], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "@@READY":
            raise RuntimeError("raw zenoh server did not start")
        session = open_session(cfg_client)
        try:
            wait_route(session, f"{key}/q")
            seq = sequential(session, f"{key}/q", n)
            gap = spaced(session, f"{key}/q", SPACED_N)
            par = inflight(session, f"{key}/q", n * 2)
            pubsub = put_sub(session, f"{key}/s", server, n * 50)
        finally:
            session.close()
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
    return {"seq_p50_ms": seq["p50_ms"], "seq_p99_ms": seq["p99_ms"], "seq_per_s": seq["per_s"],
            "spaced_p50_ms": gap, "inflight64_per_s": par, "put_sub_per_s": pubsub}


def redis_round(n: int) -> dict[str, float]:
    import redis

    key = f"istos-bench-raw-{secrets.token_hex(6)}"
    client = redis.Redis(host="127.0.0.1", port=6379)
    samples = []
    try:
        client.ping()
        t0 = time.perf_counter()
        for _ in range(n):
            t = time.perf_counter()
            client.lpush(key, PAYLOAD)
            samples.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - t0
    finally:
        client.delete(key)
        client.close()
    ms = [s * 1e3 for s in samples]
    return {"lpush_p50_ms": percentile(ms, 50), "lpush_p99_ms": percentile(ms, 99),
            "lpush_per_s": n / elapsed}


def main(argv: list[str]) -> None:
    if len(argv) > 1 and argv[1] == "server":
        serve(json.loads(argv[2]), argv[3])
        return
    p = argparse.ArgumentParser(prog="bench/_raw_limits.py")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--n", type=int, default=3000, help="sequential queries/LPUSHes per round")
    p.add_argument("--table", action="store_true")
    p.add_argument("--row", action="store_true",
                   help="one @@RESULT line of the numeric medians (bench.peers' raw block)")
    args = p.parse_args(argv[1:])
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds):
        row = {**zenoh_round(args.n), **redis_round(args.n)}
        rounds.append(row)
        print(f"  raw round {r + 1}/{args.rounds}: " + ", ".join(
            f"{k} {v:,.3f}" for k, v in row.items()), file=sys.stderr)
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    table = {
        "Zenoh query round trip, sequential: p50 / p99 ms":
            f"{med['seq_p50_ms']:.3f} / {med['seq_p99_ms']:.2f}",
        "Zenoh sequential queries/s": f"{med['seq_per_s']:,.0f}",
        "Zenoh query round trip, one every 5 ms: p50 ms": f"{med['spaced_p50_ms']:.3f}",
        "Zenoh queries/s, 64 in flight": f"{med['inflight64_per_s']:,.0f}",
        "Zenoh put -> subscriber, 100-byte messages/s": f"{med['put_sub_per_s']:,.0f}",
        "Redis LPUSH round trip (redis-py): p50 / p99 ms":
            f"{med['lpush_p50_ms']:.3f} / {med['lpush_p99_ms']:.2f}",
        "Redis sequential LPUSH/s": f"{med['lpush_per_s']:,.0f}",
    }
    if args.row:
        print(RESULT_TAG + json.dumps(med), flush=True)
    elif args.table:
        print(RESULT_TAG + json.dumps(table), flush=True)
    else:
        print(json.dumps({"medians": med, "rounds": rounds}, indent=1))
        for k, v in table.items():
            print(f"{k}: {v}")


if __name__ == "__main__":
    main(sys.argv)
