"""Raw Zenoh reproducer for issue 24 item 2: is the post-partition silence Zenoh's own?

    sudo .venv/bin/python -m bench.zenoh_partition_gap [--seconds 30] [--cut-at 3]
                                                      [--drop] [--lease-ms 10000]

No Istos at all. Three peers: A (a queryable answering "A") runs inside a network namespace of
its own, joined to the host by a veth pair; B (a queryable answering "B") and the client C run
on the host. C sends one query every 100 ms (1 s timeout, replies delivered as they arrive) and
records when a reply came. At ``--cut-at`` the veth is set down: A is fully partitioned, it
gets no FIN and no RST, exactly like a pulled cable. The output lists every stretch longer
than 0.5 s in which C got no reply at all although B was up the whole time, and what each
timed-out query got (Zenoh's "Timeout" error reply, or nothing). ``--drop`` sends the queries
with congestion control DROP (the default is BLOCK); ``--lease-ms`` sets every peer's link
lease (transport.link.tx.lease, 10 s by default).
Needs root (ip netns); it creates the namespace ``istos-gap-<pid>`` and deletes only that.
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

KEY = "gap/q"


def peer_config(listen: str, connect: list[str], lease_ms: int) -> dict[str, Any]:
    return {"mode": "peer", "listen": {"endpoints": [listen]},
            "connect": {"endpoints": connect},
            "scouting": {"multicast": {"enabled": False}, "gossip": {"enabled": False},
                         "delay": 20},
            "transport": {"link": {"tx": {"lease": lease_ms}},
                          "shared_memory": {"enabled": False}}}


def serve(config: dict[str, Any], name: str, extras: bool) -> None:
    """A queryable; with ``extras`` also what an Istos owner has: a liveliness token, a
    subscriber, and a publisher putting 100 small messages a second (events)."""
    import zenoh

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


def sh(*args: str) -> None:
    subprocess.run(list(args), check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--cut-at", type=float, default=3.0)
    parser.add_argument("--drop", action="store_true")
    parser.add_argument("--lease-ms", type=int, default=10000)
    parser.add_argument("--extras", action="store_true",
                        help="A and B also hold a liveliness token, a subscriber and a "
                             "publisher (100 puts/s), C watches liveliness, as Istos does")
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(json.loads(args.serve[0]), args.serve[1], args.serve[2] == "1")
        return
    import zenoh

    ns, host_if, ns_if = f"istos-gap-{os.getpid()}", f"vg{os.getpid() % 100000}h", \
        f"vg{os.getpid() % 100000}n"
    host_ip, ns_ip = "10.224.77.1", "10.224.77.2"
    sh("ip", "netns", "add", ns)
    procs: list[subprocess.Popen[str]] = []
    try:
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        sh("ip", "link", "set", ns_if, "netns", ns)
        sh("ip", "addr", "add", f"{host_ip}/24", "dev", host_if)
        sh("ip", "link", "set", host_if, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ns_ip}/24", "dev", ns_if)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", ns_if, "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        a_end = f"tcp/{ns_ip}:{free_port()}"
        b_end = f"tcp/{host_ip}:{free_port()}"
        c_end = f"tcp/{host_ip}:{free_port()}"
        env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
        for where, cfg, name in (
                (["ip", "netns", "exec", ns], peer_config(a_end, [], args.lease_ms), "A"),
                ([], peer_config(b_end, [a_end], args.lease_ms), "B")):
            proc = subprocess.Popen([*where, sys.executable, __file__, "--serve",
                                     json.dumps(cfg), name, "1" if args.extras else "0"],
                                    stdout=subprocess.PIPE,
                                    text=True, env=env)
            procs.append(proc)
            assert proc.stdout is not None and proc.stdout.readline().strip() == "READY"
        session = zenoh.open(zenoh.Config.from_json5(json.dumps(
            peer_config(c_end, [a_end, b_end], args.lease_ms))))
        t0 = time.monotonic()
        if args.extras:
            session.liveliness().declare_subscriber(
                "gap/alive/*", lambda s: print(f"  liveliness {s.kind} {s.key_expr} at "
                                               f"t={time.monotonic() - t0:.1f}"))
            session.declare_subscriber("gap/events/**", lambda s: None)
        time.sleep(1.0)  # let the three links come up
        got: list[tuple[float, float, str]] = []  # (sent, answered, first reply or error)
        lock = threading.Lock()
        cut = False
        cc = zenoh.CongestionControl.DROP if args.drop else zenoh.CongestionControl.BLOCK
        while time.monotonic() - t0 < args.seconds:
            if not cut and time.monotonic() - t0 >= args.cut_at:
                sh("ip", "link", "set", host_if, "down")
                cut = True
            sent = time.monotonic() - t0
            first: list[str] = []

            def on_reply(reply: Any, sent: float = sent, first: list[str] = first) -> None:
                with lock:
                    if first:
                        return
                    try:
                        first.append(reply.ok.payload.to_bytes().decode())
                    except Exception:
                        first.append("error:" + reply.err.payload.to_bytes().decode())
                    got.append((sent, time.monotonic() - t0, first[0]))

            called = time.monotonic()
            session.get(KEY, zenoh.handlers.Callback(on_reply, lambda: None, indirect=False),
                        timeout=1.0, consolidation=zenoh.ConsolidationMode.NONE,
                        congestion_control=cc)
            blocked = time.monotonic() - called
            if blocked > 0.05:
                print(f"  get() itself blocked {blocked:.2f} s at t={sent:.1f}")
            time.sleep(max(0.0, 0.1 - (time.monotonic() - called)))
        time.sleep(1.5)
        session.close()
        ok = sorted(s for s, _, first in got if not first.startswith("error"))
        print(f"cut at {args.cut_at:.1f} s; {len(ok)} answered queries; lease "
              f"{args.lease_ms} ms; congestion control {'DROP' if args.drop else 'BLOCK'}")
        longest = 0.0
        for prev, nxt in zip(ok, ok[1:]):
            if nxt - prev > 0.5:
                errors = sorted({f for s, _, f in got if prev < s < nxt})
                print(f"  no answer from {prev:.1f} s to {nxt:.1f} s ({nxt - prev:.1f} s); "
                      f"replies meanwhile: {errors or 'none'}")
            longest = max(longest, nxt - prev)
        print(f"longest stretch with no answer: {longest:.2f} s")
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(10)
        subprocess.run(["ip", "link", "del", host_if], check=False,
                       stderr=subprocess.DEVNULL)
        subprocess.run(["ip", "netns", "del", ns], check=False)


if __name__ == "__main__":
    main()
