"""Where a remote enqueue's time goes: the same sequential round trip, one layer at a time.

    .venv/bin/python -m bench.remote_enqueue [--rounds 5] [--n 1000]
                                             [--variants default,lowlatency,nobatch,noqos]

Two processes on a private loopback mesh. The server S runs an Istos app that owns a queue,
and on the same Zenoh session a raw queryable (replies inline on Zenoh's thread) and an echo
queryable through ``ZenohTransport`` (hop to the loop, a task, reply from the loop). The client
C, another Istos app, times ``--n`` sequential calls of each layer:

| layer | client side | server side |
|---|---|---|
| ``raw`` | blocking ``session.get`` (no loop) | raw callback |
| ``raw->transport`` | blocking ``session.get`` | ``ZenohTransport`` queryable, echo |
| ``transport->raw`` | ``ZenohTransport.query`` | raw callback |
| ``transport`` | ``ZenohTransport.query`` | ``ZenohTransport`` queryable, echo |
| ``ping`` | ``OwnerClient.call("ping")`` (msgpack both ways) | the owner's request path |
| ``enqueue`` | ``app.enqueue`` (body encoding, ids, checks) | the owner's enqueue |
| ``sync enqueue`` | ``istos.SyncProducer.enqueue`` (own session, no loop) | the owner's enqueue |

plus ``raw express`` (``express=True`` on the get and on the reply). Each variant is a Zenoh
config change applied to both sessions (``VARIANTS``). Rounds interleave the variants; the
table shows the median over rounds of each layer's p50 (and p99) in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import random
import secrets
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

from _common import percentile, zenoh_configs  # noqa: E402

QUEUE = "bench/jobs"
RESULT_TAG = "@@RESULT "
PAYLOAD = b"x" * 120
LAYERS = ("raw", "raw inline", "raw express", "raw->transport", "transport->raw", "transport",
          "transport express", "transport inline", "transport final hop", "ping", "ping 200B",
          "call enqueue", "enqueue", "sync enqueue")
# Extra server-side transports, each its own session, for the A/B layers above.
SERVER_EXTRAS: dict[str, dict[str, Any]] = {"echox": {"express": True}}

# Zenoh config changes tried on both sessions (paths into the JSON5 schema).
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "lowlatency": {"transport": {"unicast": {"lowlatency": True, "qos": {"enabled": False}}}},
    "nobatch": {"transport": {"link": {"tx": {"queue": {"batching": {"enabled": False}}}}}},
    "noqos": {"transport": {"unicast": {"qos": {"enabled": False}}}},
    # Not a config change: ZenohTransport.express turned on in both processes.
    "express": {},
}
CLASS_SETTINGS: dict[str, dict[str, Any]] = {"express": {"express": True}}


def apply_class_settings(variant: str) -> None:
    from istos.transport.zenoh import ZenohTransport

    for name, value in CLASS_SETTINGS.get(variant, {}).items():
        setattr(ZenohTransport, name, value)


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = merged(out.get(k, {}), v) if isinstance(v, dict) else v
    return out


# -- server ---------------------------------------------------------------------------------
async def server(spec: dict[str, Any]) -> None:
    import zenoh

    from istos import Istos
    from istos.transport.zenoh import ZenohHandle, ZenohTransport

    apply_class_settings(spec["variant"])
    app = Istos(zenoh=spec["cfg"], prefix=spec["prefix"])
    app.queue(QUEUE)
    async with app.serving():
        transport = app.node.transport
        session = transport._session  # type: ignore[union-attr]
        # Time the owner's request path (decode, dispatch, encode) per op, on the loop.
        owner = app.owners[QUEUE]
        inner = owner._on_request
        served: dict[str, list[float]] = {}

        async def timed_request(key: str, payload: bytes) -> bytes:
            t = time.perf_counter()
            out = await inner(key, payload)
            op = "enqueue" if len(payload) > 100 else "ping"
            served.setdefault(op, []).append((time.perf_counter() - t) * 1e3)
            return out

        owner._handle.close()
        owner._handle = await transport.declare_queryable(  # type: ignore[union-attr]
            app.node.key(QUEUE, "rpc") + "/*", timed_request)

        def raw(query: zenoh.Query) -> None:
            query.reply(query.key_expr, query.payload.to_bytes() if query.payload else b"")

        def raw_express(query: zenoh.Query) -> None:
            query.reply(query.key_expr, query.payload.to_bytes() if query.payload else b"",
                        express=True)

        async def echo(key: str, payload: bytes) -> bytes:
            return payload

        handles = [session.declare_queryable(f"{spec['prefix']}/raw", raw),
                   session.declare_queryable(f"{spec['prefix']}/rawi",
                                             zenoh.handlers.Callback(raw, indirect=False)),
                   session.declare_queryable(f"{spec['prefix']}/rawx", raw_express)]
        await transport.declare_queryable(f"{spec['prefix']}/echo", echo)  # type: ignore
        # The echo as ZenohTransport serves it, but with the query callback inline on Zenoh's
        # network thread (indirect=False) instead of Zenoh's default Python callback thread.
        inline = ZenohHandle(transport, "inline echo")  # type: ignore[arg-type]

        def on_query_inline(query: zenoh.Query) -> None:
            transport._post(transport._serve, inline, query, "echoi", echo)  # type: ignore

        handles.append(session.declare_queryable(
            f"{spec['prefix']}/echoi", zenoh.handlers.Callback(on_query_inline, indirect=False)))
        extras = []
        for i, (key, attrs) in enumerate(SERVER_EXTRAS.items()):
            extra = ZenohTransport(spec["extra_cfgs"][i], node_id=f"extra-{key}")
            for attr, value in attrs.items():
                setattr(extra, attr, value)  # instance attributes: only this transport
            await extra.start()
            await extra.declare_queryable(f"{spec['prefix']}/{key}", echo)
            extras.append(extra)
        print("@@READY", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        for h in handles:
            h.undeclare()
        for extra in extras:
            await extra.close()
        print(RESULT_TAG + json.dumps({f"owner path {op}": {"p50": percentile(v, 50),
                                                            "p99": percentile(v, 99)}
                                       for op, v in served.items()}), flush=True)


# -- client ---------------------------------------------------------------------------------
async def client(spec: dict[str, Any]) -> dict[str, Any]:
    from istos import Istos, SyncProducer

    apply_class_settings(spec["variant"])
    app = Istos(zenoh=spec["cfg"], prefix=spec["prefix"])
    n, p = int(spec["n"]), spec["prefix"]
    async with app.serving():
        sync = SyncProducer(spec["sync_cfg"], prefix=p, request_timeout_s=10.0)
        sync.enqueue(QUEUE, "warm-up")  # waits for the route; not part of the figures
        transport = app.node.transport
        assert transport is not None
        session = transport._session  # type: ignore[attr-defined]
        owner = app.client(QUEUE)
        await owner.call("ping")  # waits for the route
        for key in ("raw", "rawi", "rawx", "echo", "echoi", *SERVER_EXTRAS):
            await transport.query(f"{p}/{key}", b"", 5.0)

        def raw_get(key: str, express: bool = False) -> None:
            for reply in session.get(key, payload=PAYLOAD, express=express or None):
                assert reply.ok is not None

        async def query_final_hop(key: str) -> None:
            # As before the final message was skipped: it always hops to the loop. The bound
            # method is taken when the get is sent, so the swap covers this query only.
            from istos.transport import zenoh as zt

            fast = zt._PendingQuery.on_done
            zt._PendingQuery.on_done = lambda self: self._owner._post(self._done)  # type: ignore
            try:
                await transport.query(key, PAYLOAD, 5.0)  # type: ignore[union-attr]
            finally:
                zt._PendingQuery.on_done = fast  # type: ignore[method-assign]

        async def query_express(key: str) -> None:
            transport.express = True  # type: ignore[union-attr]
            try:
                await transport.query(key, PAYLOAD, 5.0)  # type: ignore[union-attr]
            finally:
                del transport.express  # type: ignore[union-attr]  # back to the class's

        body = {"i": 0, "pad": "x" * 78}
        calls: dict[str, Any] = {
            "raw": lambda: raw_get(f"{p}/raw"),
            "raw inline": lambda: raw_get(f"{p}/rawi"),
            "raw express": lambda: raw_get(f"{p}/rawx", True),
            "raw->transport": lambda: raw_get(f"{p}/echo"),
            "transport->raw": lambda: transport.query(f"{p}/rawi", PAYLOAD, 5.0),
            "transport": lambda: transport.query(f"{p}/echo", PAYLOAD, 5.0),
            "transport express": lambda: query_express(f"{p}/echox"),
            "transport inline": lambda: transport.query(f"{p}/echoi", PAYLOAD, 5.0),
            "transport final hop": lambda: query_final_hop(f"{p}/echo"),
            "ping": lambda: owner.call("ping"),
            "ping 200B": lambda: owner.call("ping", pad=b"x" * 180),
            "call enqueue": lambda: owner.call("enqueue", body=b"\x82" + b"x" * 99,
                                               job_id=app.node.ids.new(), delay_s=0.0,
                                               priority=0),
            "enqueue": lambda: app.enqueue(QUEUE, body),
            # Blocking, on this loop's thread: the owner is in the other process, so it goes
            # over the SyncProducer's own session, no loop involved.
            "sync enqueue": lambda: sync.enqueue(QUEUE, body),
        }
        samples: dict[str, list[float]] = {name: [] for name in LAYERS}
        perf = time.perf_counter
        order = list(LAYERS)
        rng = random.Random(7)
        for _ in range(n):  # each layer once per turn, in a shuffled order (a call's trailing
            rng.shuffle(order)  # work falls on whichever call follows it): bursts hit all alike
            for name in order:
                fn = calls[name]
                t = perf()
                r = fn()
                if asyncio.iscoroutine(r):
                    await r
                samples[name].append((perf() - t) * 1e3)
        sync.close()
        return {name: {"p50": percentile(s, 50), "p99": percentile(s, 99)}
                for name, s in samples.items()}


# -- orchestrator ---------------------------------------------------------------------------
def run_pair(variant: str, n: int) -> dict[str, Any]:
    cfgs = [merged(c, VARIANTS[variant]) for c in zenoh_configs(3 + len(SERVER_EXTRAS))]
    cfg_s, extra_cfgs, cfg_c, cfg_sync = cfgs[0], cfgs[1:-2], cfgs[-2], cfgs[-1]
    prefix = f"istos-bench/{secrets.token_hex(6)}"
    env_py = [sys.executable, "-u", __file__]
    srv = subprocess.Popen([*env_py, "server", json.dumps({"cfg": cfg_s, "prefix": prefix,
                                                             "variant": variant,
                                                             "extra_cfgs": extra_cfgs})],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd="/")
    try:
        assert srv.stdout is not None and srv.stdin is not None
        if srv.stdout.readline().strip() != "@@READY":
            raise RuntimeError("server did not start")
        cli = subprocess.run([*env_py, "client", json.dumps({"cfg": cfg_c, "prefix": prefix,
                                                             "n": n, "variant": variant,
                                                             "sync_cfg": cfg_sync})],
                             capture_output=True, text=True, timeout=300, cwd="/")
        result: dict[str, Any] | None = None
        for line in cli.stdout.splitlines():
            if line.startswith(RESULT_TAG):
                result = json.loads(line[len(RESULT_TAG):])
        if result is None:
            raise RuntimeError(f"client failed: {cli.stderr[-2000:]}")
        srv.stdin.write("stop\n")
        srv.stdin.flush()
        for line in srv.stdout:
            if line.startswith(RESULT_TAG):
                result.update(json.loads(line[len(RESULT_TAG):]))
                break
        return result
    finally:
        if srv.stdin is not None and not srv.stdin.closed:
            srv.stdin.close()
        try:
            srv.wait(15)
        except subprocess.TimeoutExpired:
            srv.kill()


def main(argv: list[str]) -> None:
    if len(argv) > 2 and argv[1] in ("server", "client"):
        spec = json.loads(argv[2])
        if argv[1] == "server":
            asyncio.run(server(spec))
        else:
            print(RESULT_TAG + json.dumps(asyncio.run(client(spec))), flush=True)
        return
    p = argparse.ArgumentParser(prog="python -m bench.remote_enqueue")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--variants", default=",".join(VARIANTS))
    args = p.parse_args(argv[1:])
    variants = [v for v in args.variants.split(",") if v]
    raw: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(args.rounds):
        shift = r % len(variants)
        for v in variants[shift:] + variants[:shift]:
            raw[v].append(run_pair(v, args.n))
            print(f"  round {r + 1} {v}: " + ", ".join(
                f"{k} {x['p50']:.3f}" for k, x in raw[v][-1].items()), file=sys.stderr)
    print("\nmedian over rounds of each layer's p50 / p99, ms (sequential round trips)\n")
    print("| layer | " + " | ".join(variants) + " |")
    print("|---|" + "---|" * len(variants))
    for layer in (*LAYERS, "owner path ping", "owner path enqueue"):
        cells = []
        for v in variants:
            p50 = statistics.median(x[layer]["p50"] for x in raw[v])
            p99 = statistics.median(x[layer]["p99"] for x in raw[v])
            cells.append(f"{p50:.3f} / {p99:.2f}")
        print(f"| {layer} | " + " | ".join(cells) + " |")
    out = BENCH / "results" / f"remote-enqueue-{time.strftime('%Y-%m-%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(raw, indent=1) + "\n")
    print(f"\nevery round in {out}")


if __name__ == "__main__":
    main(sys.argv)
