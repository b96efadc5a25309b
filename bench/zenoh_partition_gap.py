"""Raw Zenoh reproducer for issue 24 item 2: is the post-partition silence Zenoh's own?

    sudo .venv/bin/python -m bench.zenoh_partition_gap [--seconds 30] [--cut-at 3]
                                                      [--drop] [--lease-ms 10000]
                                                      [--far-peers N] [--no-linger]

No Istos at all. Three peers: A (a queryable answering "A") runs inside a network namespace of
its own, joined to the host by a veth pair; B (a queryable answering "B") and the client C run
on the host. C sends one query every 100 ms (1 s timeout, replies delivered as they arrive) and
records when a reply came. At ``--cut-at`` the veth is set down: A is fully partitioned, it
gets no FIN and no RST, exactly like a pulled cable. The output lists every stretch longer
than 0.5 s in which C got no reply at all although B was up the whole time, and what each
timed-out query got (Zenoh's "Timeout" error reply, or nothing). ``--drop`` sends the queries
with congestion control DROP (the default is BLOCK); ``--lease-ms`` sets every peer's link
lease (transport.link.tx.lease, 10 s by default). ``--far-peers N`` adds N peers inside the
namespace that publish to B: when their link leases expire B drops N + 1 links at once, and
Zenoh closes each on a receive thread with ``SO_LINGER`` 10 s, so ``close`` blocks that thread
until the timeout (the peer never acknowledges): C gets no reply from B meanwhile.
``--no-linger`` turns the option off in every process, as Istos's transport does.
Needs root (ip netns); it creates the namespace ``istos-gap-<pid>-<n>`` (``bench/_netns.py``:
every packet stays on this machine) and deletes only that.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import free_port  # noqa: E402
from bench._netns import Veth, gaps, veth_namespace  # noqa: E402

KEY = "gap/q"


WAIT_BEFORE_CLOSE_MS: int | None = None


def peer_config(listen: str, connect: list[str], lease_ms: int) -> dict[str, Any]:
    tx: dict[str, Any] = {"lease": lease_ms}
    if WAIT_BEFORE_CLOSE_MS is not None:
        tx["queue"] = {"congestion_control": {"block": {
            "wait_before_close": WAIT_BEFORE_CLOSE_MS * 1000}}}
    return {"mode": "peer", "listen": {"endpoints": [listen]},
            "connect": {"endpoints": connect},
            "scouting": {"multicast": {"enabled": False}, "gossip": {"enabled": False},
                         "delay": 20},
            "transport": {"link": {"tx": tx},
                          "shared_memory": {"enabled": False}}}


def relax_linger_forever() -> None:
    """What Istos's transport does (istos/transport/_linger.py), on a thread of its own."""
    from istos.transport._linger import SWEEP_S, relax_zenoh_linger

    def loop() -> None:
        while True:
            relax_zenoh_linger()
            time.sleep(SWEEP_S)

    threading.Thread(target=loop, daemon=True).start()


def serve(config: dict[str, Any], name: str, extras: bool, no_linger: bool) -> None:
    """A queryable; with ``extras`` also what an Istos owner has: a liveliness token, a
    subscriber, and a publisher putting 100 small messages a second (events)."""
    import zenoh

    if no_linger:
        relax_linger_forever()
    session = zenoh.open(zenoh.Config.from_json5(json.dumps(config)))
    session.declare_queryable(KEY, lambda q: q.reply(KEY, name.encode()))
    if extras:
        session.liveliness().declare_token(f"gap/alive/{name}")
        session.declare_subscriber("gap/events/**", lambda s: None)
        pub = session.declare_publisher(f"gap/events/{name}",
                                        congestion_control=zenoh.CongestionControl.DROP)
    print("READY", flush=True)
    while True:
        if extras:
            pub.put(b"e" * 200)
        time.sleep(0.01)


def start_servers(args: argparse.Namespace, veth: Veth, a_end: str, b_end: str
                  ) -> list[subprocess.Popen[str]]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    procs = []
    far = [(veth.exec, peer_config(f"tcp/{veth.ns_ip}:{free_port()}", [a_end, b_end],
                                   args.lease_ms), f"F{i}") for i in range(args.far_peers)]
    for where, cfg, name in ((veth.exec, peer_config(a_end, [], args.lease_ms),
                              "A"), ([], peer_config(b_end, [a_end], args.lease_ms), "B"),
                             *far):
        extras = args.extras or name.startswith("F")  # far peers publish toward B
        proc = subprocess.Popen([*where, sys.executable, __file__, "--serve", json.dumps(cfg),
                                 name, "1" if extras else "0",
                                 "1" if args.no_linger else "0"], stdout=subprocess.PIPE,
                                text=True, env=env)
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
    return procs


def query_through_cut(session: Any, args: argparse.Namespace, veth: Veth,
                      t0: float) -> list[tuple[float, str]]:
    """One query every 100 ms; cut at --cut-at; (with --declare-after) publish and declare."""
    import zenoh

    got: list[tuple[float, str]] = []  # (sent, first reply or error)
    lock = threading.Lock()
    cc = zenoh.CongestionControl.DROP if args.drop else zenoh.CongestionControl.BLOCK
    pub = session.declare_publisher("gap/events/C",
                                    congestion_control=zenoh.CongestionControl.DROP)
    cut = declared = False
    while time.monotonic() - t0 < args.seconds:
        now = time.monotonic() - t0
        if not cut and now >= args.cut_at:
            veth.cut()
            cut = True
        if args.declare_after is not None:
            for _ in range(10):
                pub.put(b"e" * 20000)
            if cut and not declared and now >= args.cut_at + args.declare_after:
                declared = True
                began = time.monotonic()
                session.declare_queryable("gap/other", lambda q: None)
                print(f"  declare_queryable at t={now:.1f} took "
                      f"{time.monotonic() - began:.2f} s")
        first: list[str] = []

        def on_reply(reply: Any, sent: float = now, first: list[str] = first) -> None:
            with lock:
                if not first:
                    try:
                        first.append(reply.ok.payload.to_bytes().decode())
                    except Exception:
                        first.append("error:" + reply.err.payload.to_bytes().decode())
                    got.append((sent, first[0]))

        called = time.monotonic()
        session.get(KEY, zenoh.handlers.Callback(on_reply, lambda: None, indirect=False),
                    timeout=1.0, consolidation=zenoh.ConsolidationMode.NONE,
                    congestion_control=cc)
        if time.monotonic() - called > 0.05:
            print(f"  get() itself blocked {time.monotonic() - called:.2f} s at t={now:.1f}")
        time.sleep(max(0.0, 0.1 - (time.monotonic() - called)))
    return got


def run(args: argparse.Namespace, veth: Veth) -> None:
    import zenoh

    a_end, b_end, c_end = (f"tcp/{ip}:{free_port()}"
                           for ip in (veth.ns_ip, veth.host_ip, veth.host_ip))
    procs = start_servers(args, veth, a_end, b_end)
    try:
        session = zenoh.open(zenoh.Config.from_json5(json.dumps(
            peer_config(c_end, [a_end, b_end], args.lease_ms))))
        t0 = time.monotonic()
        if args.extras:
            session.liveliness().declare_subscriber("gap/alive/*", lambda s: None)
            session.declare_subscriber("gap/events/**", lambda s: None)
        time.sleep(1.0)  # let the three links come up
        got = query_through_cut(session, args, veth, t0)
        time.sleep(1.5)
        try:
            session.close()
        except zenoh.ZError as exc:  # a close while the cut peer's link still lives can time out
            print(f"  session.close(): {exc}")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
    ok = sorted(s for s, first in got if not first.startswith("error"))
    print(f"cut at {args.cut_at:.1f} s; {len(ok)} answered queries; lease "
          f"{args.lease_ms} ms; congestion control {'DROP' if args.drop else 'BLOCK'}")
    longest, lines = gaps(ok, got)
    for line in lines:
        print(line)
    print(f"longest stretch with no answer: {longest:.2f} s")


def main() -> None:
    global WAIT_BEFORE_CLOSE_MS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--cut-at", type=float, default=3.0)
    parser.add_argument("--drop", action="store_true")
    parser.add_argument("--lease-ms", type=int, default=10000)
    parser.add_argument("--extras", action="store_true",
                        help="A and B also hold a liveliness token, a subscriber and a "
                             "publisher (100 puts/s), C watches liveliness, as Istos does")
    parser.add_argument("--declare-after", type=float, default=None, metavar="S",
                        help="C publishes 10 x 20 KB per query and, S s after the cut, "
                             "declares a queryable (as a new leader binds its queue)")
    parser.add_argument("--wait-before-close-ms", type=int, default=None,
                        help="transport.link.tx.queue.congestion_control.block."
                             "wait_before_close for every peer (Zenoh's default: 5000)")
    parser.add_argument("--far-peers", type=int, default=0, metavar="N",
                        help="N more peers inside the namespace, connected to A and B and "
                             "publishing to B: links B loses together when their leases expire")
    parser.add_argument("--no-linger", action="store_true",
                        help="every process turns SO_LINGER off on Zenoh's links, as Istos does")
    parser.add_argument("--serve", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(json.loads(args.serve[0]), args.serve[1], args.serve[2] == "1",
              args.serve[3] == "1")
        return
    if args.no_linger:
        relax_linger_forever()
    WAIT_BEFORE_CLOSE_MS = args.wait_before_close_ms
    with veth_namespace("gap") as veth:
        run(args, veth)


if __name__ == "__main__":
    main()
