"""Raw Zenoh reproducer for issue 24 item 4: a queryable's RSS against client-session churn.

    .venv/bin/python -m bench.zenoh_session_churn [--sessions 8] [--queries 5000]
                                                  [--payload 20000] [--trim]

No Istos at all: one process declares a queryable that answers every query with a small reply
(the owner's role); this process opens ``--sessions`` sessions one after the other, each sends
``--queries`` queries of ``--payload`` bytes (about what an ``enqueue_many`` of 500 jobs is)
with 64 in flight, and closes. After each session the queryable process reports its RSS (from
/proc) and, with ``--trim``, its RSS again after glibc's ``malloc_trim(0)``: if trimming gives
the memory back, the growth is freed memory the allocator kept (per-thread arenas of Zenoh's
runtime threads), not state Zenoh still holds per peer.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import zenoh_configs  # noqa: E402

KEY = "churn/q"


def rss_mb(pid: str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def threads(pid: str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return -1


def serve(config: dict[str, Any]) -> None:
    """The queryable side: answer each query; on a line "rss" / "trim" on stdin, report."""
    import zenoh

    session = zenoh.open(zenoh.Config.from_json5(json.dumps(config)))

    def on_query(query: Any) -> None:
        query.reply(KEY, b"ok")

    queryable = session.declare_queryable(KEY, on_query)
    print("READY", flush=True)
    libc = ctypes.CDLL("libc.so.6")
    for line in sys.stdin:
        if line.strip() == "trim":
            libc.malloc_trim(0)
        print(f"{rss_mb():.1f} {threads()}", flush=True)
    queryable.undeclare()
    session.close()


def one_session(config: dict[str, Any], queries: int, payload: int) -> None:
    import zenoh

    session = zenoh.open(zenoh.Config.from_json5(json.dumps(config)))
    body = b"x" * payload
    slots = threading.Semaphore(64)
    done = threading.Event()
    left = [queries]
    lock = threading.Lock()

    def on_reply(_reply: Any) -> None:
        pass

    def finished() -> None:
        slots.release()
        with lock:
            left[0] -= 1
            if left[0] == 0:
                done.set()

    for _ in range(queries):
        slots.acquire()
        session.get(KEY, zenoh.handlers.Callback(on_reply, finished), payload=body,
                    timeout=10.0)
    done.wait(120)
    session.close()


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merge(out.get(key) or {}, value) if isinstance(value, dict) else value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--queries", type=int, default=5000)
    parser.add_argument("--payload", type=int, default=20000)
    parser.add_argument("--trim", action="store_true")
    parser.add_argument("--serve-config", default="{}", metavar="JSON",
                        help="merged into the queryable's config, e.g. "
                             "'{\"transport\": {\"link\": {\"tx\": {\"batch_size\": 8192}}}}'")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(json.loads(args.serve))
        return
    server_cfg, client_cfg = zenoh_configs(2)
    server_cfg = merge(server_cfg, json.loads(args.serve_config))
    proc = subprocess.Popen([sys.executable, __file__, "--serve", json.dumps(server_cfg)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "READY"

        last_threads = [0]

        def ask(what: str) -> float:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(what + "\n")
            proc.stdin.flush()
            rss, count = proc.stdout.readline().split()
            last_threads[0] = int(count)
            return float(rss)

        print(f"queryable RSS at start: {ask('rss'):.1f} MB")
        print("session  queries  RSS MB  " + ("after malloc_trim" if args.trim else ""))
        for i in range(args.sessions):
            started = time.perf_counter()
            one_session(client_cfg, args.queries, args.payload)
            time.sleep(1.0)  # let the peer's link teardown finish before reading RSS
            line = f"{i + 1:>7}  {args.queries:>7}  {ask('rss'):>6.1f}"
            if args.trim:
                line += f"  {ask('trim'):>6.1f}"
            print(line + f"  threads {last_threads[0]}  ({time.perf_counter() - started:.1f} s)",
                  flush=True)
    finally:
        proc.kill()
        proc.wait(10)


if __name__ == "__main__":
    main()
