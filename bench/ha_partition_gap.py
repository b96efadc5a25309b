"""Istos HA under a full partition of the leader: the longest stretch with no owner answering.

    sudo .venv/bin/python -m bench.ha_partition_gap [--seconds 30] [--cut-at 3]
                                                    [--ha-lease 1.5] [--load] [--zenoh JSON]

Replica A (``tests/procs/ledger_node.py replica``) runs in a network namespace of its own joined
to the host by a veth pair; replica B, a private redis-server (bound to the host's end of the
veth) and the probe run on the host. A leads; the probe asks ``stats`` every 100 ms (1 s
timeout). At ``--cut-at`` the veth goes down: A loses the mesh and the store at once, with no FIN
and no RST. Printed: every stretch over 0.5 s with no ok answer, what the failed requests got,
and when B took over. The bound to meet: ``ha_lease_s`` plus one Zenoh link lease (10 s unless
``--zenoh`` changes ``transport.link.tx.lease``). ``--load`` adds a worker process on the host
and about 200 enqueues a second from the probe. ``--zenoh`` is merged into every node's config.
Needs root; it creates the namespace ``istos-hagap-<pid>-<n>`` (``bench/_netns.py``: every packet
stays on this machine) and deletes only that.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._common import free_port  # noqa: E402
from bench._netns import Veth, gaps, veth_namespace  # noqa: E402
from bench.zenoh_session_churn import merge  # noqa: E402

NODE = ROOT / "tests" / "procs" / "ledger_node.py"


def config(listen: str, connect: list[str], extra: dict[str, Any]) -> dict[str, Any]:
    return merge({"mode": "peer", "listen": {"endpoints": [listen]},
                  "connect": {"endpoints": connect},
                  "scouting": {"multicast": {"enabled": False}, "gossip": {"enabled": False},
                               "delay": 20}}, extra)


class Nodes:
    """The node processes, each one's stdout lines with the time they arrived."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.lines: dict[str, collections.deque[tuple[float, str]]] = {}
        self.t0 = time.monotonic()

    async def start(self, name: str, argv: list[str], word: str) -> None:
        proc = self.procs[name] = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=self.env)
        self.lines[name] = collections.deque()
        asyncio.get_running_loop().create_task(self._follow(name, proc))
        deadline = time.monotonic() + 30
        while not any(w == word for _, w in self.lines[name]):
            if time.monotonic() > deadline:
                raise SystemExit(f"{name} never printed {word}: {list(self.lines[name])}")
            await asyncio.sleep(0.05)

    async def _follow(self, name: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        while line := await asyncio.to_thread(proc.stdout.readline):
            self.lines[name].append((time.monotonic() - self.t0, line.strip()))

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.wait(10)


async def probe_through_cut(probe: Any, args: argparse.Namespace, veth: Veth,
                            t0: float) -> list[tuple[float, str]]:
    """Ask ``stats`` every 100 ms (and enqueue under ``--load``); cut the link at --cut-at."""
    got: list[tuple[float, str]] = []

    async def ask(sent: float) -> None:
        try:
            await probe.client("q").call("stats", timeout_s=1.0)
            got.append((sent, "ok"))
        except Exception as exc:
            got.append((sent, f"{type(exc).__name__}: {str(exc)[:60]}"))

    async def feed() -> None:
        i = 0
        while time.monotonic() - t0 < args.seconds:
            try:
                await probe.enqueue("q", {"i": i}, timeout_s=1.0)
            except Exception:
                await asyncio.sleep(0.05)
            i += 1
            await asyncio.sleep(0.005)

    pending = [asyncio.create_task(feed())] if args.load else []
    cut = False
    while time.monotonic() - t0 < args.seconds:
        if not cut and time.monotonic() - t0 >= args.cut_at:
            veth.cut()
            cut = True
        pending.append(asyncio.create_task(ask(time.monotonic() - t0)))
        await asyncio.sleep(0.1)  # the probe's cadence
    await asyncio.gather(*pending)
    return got


async def run(args: argparse.Namespace, veth: Veth) -> None:
    from istos import Istos

    extra = json.loads(args.zenoh)
    a_end, b_end, c_end, w_end = (f"tcp/{ip}:{free_port()}"
                                  for ip in (veth.ns_ip, *[veth.host_ip] * 3))
    port = free_port()
    redis = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port",
                              str(port), "--bind", veth.host_ip, "--save", "", "--appendonly", "no",
                              "--protected-mode", "no"],  # a private server on a private link
                             stdout=subprocess.DEVNULL)
    url, prefix, ledger = f"redis://{veth.host_ip}:{port}/0", f"hagap-{os.getpid()}", \
        f"/tmp/hagap-{os.getpid()}.ledger"
    nodes = Nodes(dict(os.environ, PYTHONPATH=str(ROOT), ISTOS_HA_LEASE_S=str(args.ha_lease)))
    node = [sys.executable, str(NODE)]
    try:
        time.sleep(0.3)  # redis-server binding its port
        await nodes.start("A", [*veth.exec, *node, "replica",
                                json.dumps(config(a_end, [], extra)), prefix, url, "hagap"],
                          "LEADING")
        await nodes.start("B", [*node, "replica", json.dumps(config(b_end, [a_end], extra)),
                                prefix, url, "hagap"], "STANDBY")
        if args.load:
            await nodes.start("W", [*node, "worker", json.dumps(config(w_end, [a_end, b_end],
                                                                       extra)),
                                    prefix, url, "hagap", ledger], "READY")
        probe = Istos(zenoh=config(c_end, [a_end, b_end], extra), prefix=prefix,
                      node_id="probe", request_timeout_s=1.0)
        async with probe.serving():
            nodes.t0 = t0 = time.monotonic()
            got = await probe_through_cut(probe, args, veth, t0)
        report(args, got, [t for t, w in nodes.lines["B"] if w == "LEADING"])
    finally:
        nodes.stop()
        Path(ledger).unlink(missing_ok=True)
        redis.kill()
        redis.wait(10)


def report(args: argparse.Namespace, got: list[tuple[float, str]], took: list[float]) -> None:
    ok = sorted(t for t, what in got if what == "ok")
    print(f"cut at {args.cut_at:.1f} s; ha_lease_s {args.ha_lease}; B leading at "
          f"{', '.join(f'{t:.1f}' for t in took) or 'never'} s; {len(ok)}/{len(got)} ok")
    longest, lines = gaps(ok, got)
    for line in lines:
        print(line)
    print(f"longest stretch with no owner answering: {longest:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--cut-at", type=float, default=3.0)
    parser.add_argument("--ha-lease", type=float, default=1.5)
    parser.add_argument("--zenoh", default="{}", metavar="JSON")
    parser.add_argument("--load", action="store_true",
                        help="a worker process on the host and ~200 enqueues/s from the probe")
    args = parser.parse_args()
    with veth_namespace("hagap") as veth:
        asyncio.run(run(args, veth))


if __name__ == "__main__":
    main()
