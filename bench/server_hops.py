"""The server side of one ``ZenohTransport`` request, stamp by stamp.

    PYTHONPATH=. .venv/bin/python -m bench.server_hops [--rounds 3] [--n 3000]

Two processes on a private loopback mesh. The server is a ``ZenohTransport`` whose echo
queryable is declared exactly as ``declare_queryable`` does it (Zenoh's default callback, a hop
to the loop, one task per query), with ``perf_counter`` stamps at each step; ``_answer`` is
replaced by a copy that also stamps around ``query.reply`` and ``query.drop``. The client is a
raw blocking ``session.get`` (no loop), so only the server's steps differ from the raw round
trip. Prints, per round, the client's p50 and the server's median microseconds for:

- ``hop``: Zenoh's callback thread -> the loop (``_post``: inbox + ``call_soon_threadsafe``);
- ``task start``: ``_serve`` created the task -> the handler runs (one more loop iteration);
- ``reply``, ``drop``: the two Zenoh calls that answer and finalise the query, on the loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import zenoh

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from _common import zenoh_configs  # noqa: E402

KEY = "istos-bench/hops/echo"
STEPS = (("hop", "cb", "serve"), ("task start", "serve", "handler"),
         ("reply", "returned", "replied"), ("drop", "replied", "dropped"))


async def server(cfg: dict[str, Any]) -> None:
    from istos.transport.zenoh import ZenohHandle, ZenohTransport

    transport = ZenohTransport(cfg, node_id="hops-server")
    await transport.start()
    marks: list[dict[str, float]] = []
    cur: dict[str, float] = {}
    perf = time.perf_counter

    def serve(*args: Any) -> None:
        cur["serve"] = perf()
        transport._serve(*args)

    async def echo(key: str, payload: bytes) -> bytes:
        cur["handler"] = perf()
        return payload

    async def answer(query: zenoh.Query, declared: str, handler: Any) -> None:
        key = str(query.key_expr)
        payload = query.payload
        result = await handler(key, payload.to_bytes() if payload is not None else b"")
        cur["returned"] = perf()
        query.reply(key, result)
        cur["replied"] = perf()
        query.drop()
        cur["dropped"] = perf()
        marks.append(dict(cur))

    transport._answer = answer  # type: ignore[method-assign]
    handle = ZenohHandle(transport, "stamped echo")

    def on_query(query: zenoh.Query) -> None:  # Zenoh's thread, as in declare_queryable
        cur["cb"] = perf()
        transport._post(serve, handle, query, KEY, echo)

    session = transport._session
    assert session is not None
    queryable = session.declare_queryable(KEY, zenoh.handlers.Callback(on_query))
    print("@@READY", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    warm = marks[100:] or marks
    print(json.dumps({name: statistics.median((m[b] - m[a]) * 1e6 for m in warm)
                      for name, a, b in STEPS}), flush=True)
    queryable.undeclare()
    await transport.close()


def one_round(n: int) -> dict[str, float]:
    cfg_s, cfg_c = zenoh_configs(2)
    srv = subprocess.Popen([sys.executable, "-u", __file__, "server", json.dumps(cfg_s)],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert srv.stdin is not None and srv.stdout is not None
    try:
        if srv.stdout.readline().strip() != "@@READY":
            raise RuntimeError("the stamped server did not start")
        session = zenoh.open(zenoh.Config.from_json5(json.dumps(cfg_c)))
        try:
            deadline = time.monotonic() + 20
            while not any(r.ok is not None for r in session.get(KEY, payload=b"", timeout=1)):
                if time.monotonic() > deadline:
                    raise TimeoutError("no route to the stamped server")
            samples = []
            for _ in range(n):
                t = time.perf_counter()
                for _reply in session.get(KEY, payload=b"x" * 120):
                    pass
                samples.append((time.perf_counter() - t) * 1e6)
        finally:
            session.close()
        srv.stdin.write("stop\n")
        srv.stdin.flush()
        steps: dict[str, float] = json.loads(srv.stdout.readline())
        return {"client p50": statistics.median(samples), **steps}
    finally:
        srv.stdin.close()
        try:
            srv.wait(10)
        except subprocess.TimeoutExpired:
            srv.kill()


def main(argv: list[str]) -> None:
    if len(argv) > 2 and argv[1] == "server":
        asyncio.run(server(json.loads(argv[2])))
        return
    p = argparse.ArgumentParser(prog="python -m bench.server_hops")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=3000)
    args = p.parse_args(argv[1:])
    rounds = [one_round(args.n) for _ in range(args.rounds)]
    print("| us (median) | " + " | ".join(f"round {i + 1}" for i in range(len(rounds))) + " |")
    print("|---|" + "---|" * len(rounds))
    for name in rounds[0]:
        print(f"| {name} | " + " | ".join(f"{r[name]:.1f}" for r in rounds) + " |")


if __name__ == "__main__":
    main(sys.argv)
