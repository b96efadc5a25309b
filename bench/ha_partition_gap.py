"""Istos HA under a partition of the leader: the longest stretch with no owner answering.

    sudo .venv/bin/python -m bench.ha_partition_gap [--seconds 30] [--cut-at 3] [--heal-at S]
                                                    [--ha-lease 5] [--load] [--far-side]
                                                    [--mesh-only] [--job-s 0.05] [--rate 70]
                                                    [--zenoh JSON] [--json]
                                                    [--log-dir DIR] [--dump-at S]

Replica A (``tests/procs/ledger_node.py replica``) runs in a network namespace of its own joined
to the host by a veth pair (``bench/_netns.py``: every packet stays on this machine); replica
B, a private redis-server (bound to the host's end of the veth) and a probe process
(``bench/_partition_probe.py``: ``stats`` every 100 ms, 1 s timeout) run on the host. A leads.
At ``--cut-at`` the veth goes down: A loses the mesh and the store at once, with no FIN and no
RST; at ``--heal-at`` (if given) it comes back up. With ``--mesh-only`` A reaches the store by
a second veth that stays up, so the cut takes only the mesh from it (it keeps leading).

``--load`` adds a worker process on the host (concurrency 8, ``--job-s`` per job) and has the
probes enqueue ``--rate`` jobs a second. ``--far-side`` adds a worker and a probe inside the
namespace, next to A: the side that is cut off. ``--zenoh`` is merged into every node's config.

Printed: when B took over and when A printed STANDBY (from the cut); the host probe's every
stretch over 0.5 s with no ok answer, what the failed requests got, and the longest one from
the last answer before the cut to the end of the run; with a heal, how long each probe took to
reach an owner again; with ``--load``, enqueues refused and jobs lost (an enqueue answered ok
whose job no worker finished within 30 s after the run); with ``--json``, all of it as one JSON
line last. ``--log-dir`` keeps every node's output (Zenoh's log too, with ``RUST_LOG`` set) and
``--dump-at S`` B's and W's native thread stacks (gdb) S seconds after the cut. Needs root; it
creates the namespace ``istos-hagap-<pid>-<n>`` and deletes only that.
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
from bench._netns import Veth, gaps, second_link, veth_namespace  # noqa: E402
from bench.zenoh_session_churn import merge  # noqa: E402

NODE = ROOT / "tests" / "procs" / "ledger_node.py"
PROBE = ROOT / "bench" / "_partition_probe.py"
DRAIN_S = 30.0  # after the run, how long the workers get to finish every accepted job


def config(listen: str, connect: list[str], extra: dict[str, Any]) -> dict[str, Any]:
    return merge({"mode": "peer", "listen": {"endpoints": [listen]},
                  "connect": {"endpoints": connect},
                  "scouting": {"multicast": {"enabled": False}, "gossip": {"enabled": False},
                               "delay": 20}}, extra)


class Nodes:
    """The node processes, each one's stdout lines with the monotonic time they arrived."""

    def __init__(self, env: dict[str, str], log_dir: str | None = None) -> None:
        self.env = env
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.lines: dict[str, collections.deque[tuple[float, str]]] = {}

    async def start(self, name: str, argv: list[str], word: str) -> None:
        err = open(f"{self.log_dir}/{name}.log", "w") if self.log_dir else subprocess.DEVNULL
        proc = self.procs[name] = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=err, text=True, env=self.env)
        self.lines[name] = collections.deque()
        asyncio.get_running_loop().create_task(self._follow(name, proc))
        deadline = time.monotonic() + 30
        while not any(w == word for _, w in self.lines[name]):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"{name} never printed {word}: {list(self.lines[name])}")
            await asyncio.sleep(0.05)

    async def _follow(self, name: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        log = open(f"{self.log_dir}/{name}.out", "w") if self.log_dir else None
        while line := await asyncio.to_thread(proc.stdout.readline):
            self.lines[name].append((time.monotonic(), line.strip()))
            if log is not None:  # Zenoh's log comes on stdout, mixed with the node's lines
                log.write(line)
        if log is not None:
            log.close()

    def said(self, name: str, word: str) -> list[float]:
        return [t for t, w in self.lines.get(name, ()) if w == word]

    def answers(self, name: str, kind: str) -> list[tuple[float, str]]:
        """A probe's (sent, outcome) for its ``S`` (stats) or ``E`` (enqueue) lines."""
        out = []
        for _, line in self.lines.get(name, ()):
            parts = line.split()
            if len(parts) >= 3 and parts[0] == kind:
                out.append((float(parts[1]), parts[2]))
        return out

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.kill()
            proc.wait(10)


async def start_nodes(nodes: Nodes, args: argparse.Namespace, veth: Veth,
                      urls: tuple[str, str], prefix: str, ledger: str) -> None:
    """A (in the namespace) reaches the store at ``urls[0]``, everyone else at ``urls[1]``."""
    a_url, url = urls
    extra = json.loads(args.zenoh)
    a_end, b_end, w_end, p_end = (f"tcp/{ip}:{free_port()}"
                                  for ip in (veth.ns_ip, *[veth.host_ip] * 3))
    node = [sys.executable, str(NODE)]
    probe = [sys.executable, str(PROBE)]
    rate = [str(args.rate)] if args.load else []
    await nodes.start("A", [*veth.exec, *node, "replica", json.dumps(config(a_end, [], extra)),
                            prefix, a_url, "hagap"], "LEADING")
    await nodes.start("B", [*node, "replica", json.dumps(config(b_end, [a_end], extra)),
                            prefix, url, "hagap"], "STANDBY")
    if args.load:
        await nodes.start("W", [*node, "worker", json.dumps(config(w_end, [a_end, b_end], extra)),
                                prefix, url, "hagap", ledger], "READY")
    await nodes.start("P", [*probe, json.dumps(config(p_end, [a_end, b_end], extra)), prefix,
                            "q", *rate], "READY")
    if args.far_side:
        fw_end, fp_end = (f"tcp/{veth.ns_ip}:{free_port()}" for _ in range(2))
        if args.load:
            await nodes.start("FW", [*veth.exec, *node, "worker", json.dumps(
                config(fw_end, [a_end, b_end], extra)), prefix, url, "hagap", ledger], "READY")
        await nodes.start("FP", [*veth.exec, *probe, json.dumps(
            config(fp_end, [a_end, b_end], extra)), prefix, "q", *rate], "READY")


async def run(args: argparse.Namespace, veth: Veth, store: Veth | None) -> dict[str, Any]:
    """``store``: the second link A reaches its store by (``--mesh-only``), else None."""
    port = free_port()
    binds = [veth.host_ip] + ([store.host_ip] if store else [])
    redis = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port",
                              str(port), "--bind", *binds, "--save", "", "--appendonly",
                              "no", "--protected-mode", "no"],  # a private server, private link
                             stdout=subprocess.DEVNULL)
    urls = (f"redis://{binds[-1]}:{port}/0", f"redis://{veth.host_ip}:{port}/0")
    prefix, ledger = f"hagap-{os.getpid()}", f"/tmp/hagap-{os.getpid()}.ledger"
    nodes = Nodes(dict(os.environ, PYTHONPATH=str(ROOT), ISTOS_HA_LEASE_S=str(args.ha_lease),
                       ISTOS_JOB_S=str(args.job_s)), args.log_dir)
    try:
        await asyncio.sleep(0.3)  # redis-server binding its port
        await start_nodes(nodes, args, veth, urls, prefix, ledger)
        t0 = time.monotonic()
        cut_at = t0 + args.cut_at
        await asyncio.sleep(max(0.0, cut_at - time.monotonic()))
        cut_at = time.monotonic()
        print(f"cut at wall time {time.time():.3f}")
        veth.cut()
        for after in args.dump_at:
            asyncio.get_running_loop().create_task(dump_stacks(nodes, cut_at + after))
        heal_at = None
        if args.heal_at is not None:
            await asyncio.sleep(max(0.0, t0 + args.heal_at - time.monotonic()))
            heal_at = time.monotonic()
            veth.heal()
        await asyncio.sleep(max(0.0, t0 + args.seconds - time.monotonic()))
        for name in ("P", "FP"):
            if name in nodes.procs:
                nodes.procs[name].kill()
        lost = await drain(nodes, ledger) if args.load else None
        return report(args, nodes, cut_at, heal_at, lost)
    finally:
        nodes.stop()
        Path(ledger).unlink(missing_ok=True)
        redis.kill()
        redis.wait(10)


async def dump_stacks(nodes: Nodes, at: float) -> None:
    """At ``at``, the native stacks of every thread of B and W (gdb) into the log directory."""
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    for name in ("B", "W"):
        proc = nodes.procs[name]
        out = await asyncio.to_thread(subprocess.run, [
            "gdb", "-p", str(proc.pid), "-batch", "-ex", "thread apply all bt 25"],
            capture_output=True, text=True, check=False)
        with open(f"{nodes.log_dir or '/tmp'}/{name}.stacks", "a", encoding="utf-8") as f:
            f.write(f"=== {time.monotonic():.3f}\n{out.stdout}{out.stderr}\n")


async def drain(nodes: Nodes, ledger: str) -> int:
    """Jobs accepted (enqueue answered ok) that no worker finished within DRAIN_S."""
    accepted = {line.split()[3] for name in ("P", "FP") for _, line in nodes.lines.get(name, ())
                if line.startswith("E ") and line.split()[2] == "ok"}
    done: set[str] = set()
    deadline = time.monotonic() + DRAIN_S
    while time.monotonic() < deadline:
        done = set()
        with open(ledger, encoding="utf-8") as f:
            for line in f:
                done.add(json.loads(line)["i"])
        if accepted <= done:
            break
        await asyncio.sleep(0.5)
    return len(accepted - done)


def report(args: argparse.Namespace, nodes: Nodes, cut_at: float, heal_at: float | None,
           lost: int | None) -> dict[str, Any]:
    took = [t - cut_at for t in nodes.said("B", "LEADING")]
    stood = [t - cut_at for t in nodes.said("A", "STANDBY") if t > cut_at]
    print(f"ha_lease_s {args.ha_lease}; cut at {args.cut_at:.1f} s"
          + (f", healed at {args.heal_at:.1f} s" if heal_at else "")
          + f"; B leading {', '.join(f'{t:+.2f}' for t in took) or 'never'} s from the cut"
          + f"; A standing by {', '.join(f'{t:+.2f}' for t in stood) or 'never'} s")
    out: dict[str, Any] = {"took": took, "stood": stood, "lost": lost}
    for name in ("P", "FP"):
        if name not in nodes.procs:
            continue
        got = [(t - cut_at, w) for t, w in nodes.answers(name, "S")]
        ok = sorted(t for t, w in got if w == "ok")
        refused = sum(1 for _, w in nodes.answers(name, "E") if w != "ok")
        out[name] = {"ok": len(ok), "sent": len(got), "refused": refused}
        print(f"probe {name}: {len(ok)}/{len(got)} ok; enqueues refused: {refused}")
        if name == "P":  # the side that keeps a replica: it should always reach an owner
            before = [t for t in ok if t < 0]
            span = before[-1:] + [t for t in ok if t >= 0] + [got[-1][0] if got else 0.0]
            longest, lines = gaps(span, got)
            out[name]["longest"] = longest
            for line in lines:
                print(line)
        if heal_at is not None:
            after = [t for t in ok if t >= heal_at - cut_at]
            back = after[0] - (heal_at - cut_at) if after else None
            out[name]["back"] = back
            print(f"probe {name}: first owner answer after the heal: "
                  + (f"{back:.2f} s" if back is not None else "never"))
    if lost is not None:
        print(f"jobs lost: {lost}")
    print(f"longest stretch with no owner answering: {out['P']['longest']:.2f} s")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--cut-at", type=float, default=3.0)
    parser.add_argument("--heal-at", type=float, default=None)
    parser.add_argument("--ha-lease", type=float, default=5.0)
    parser.add_argument("--job-s", type=float, default=0.05)
    parser.add_argument("--rate", type=float, default=70.0)
    parser.add_argument("--zenoh", default="{}", metavar="JSON")
    parser.add_argument("--load", action="store_true",
                        help="a worker process on the host; the probes enqueue --rate jobs/s")
    parser.add_argument("--mesh-only", action="store_true",
                        help="A reaches the store by a second link that stays up: the cut "
                             "takes only the mesh from it (it keeps leading)")
    parser.add_argument("--far-side", action="store_true",
                        help="a probe (and with --load a worker) inside the namespace, by A")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON last")
    parser.add_argument("--dump-at", type=float, action="append", default=[], metavar="S",
                        help="S s after the cut, dump B's and W's thread stacks with gdb "
                             "(repeatable; into --log-dir)")
    parser.add_argument("--log-dir", default=None,
                        help="write each node's stderr to DIR/<name>.log and its stdout to "
                             "DIR/<name>.out (with RUST_LOG set, Zenoh's log goes there)")
    args = parser.parse_args()
    with veth_namespace("hagap") as veth:
        if args.mesh_only:
            with second_link(veth) as store:
                out = asyncio.run(run(args, veth, store))
        else:
            out = asyncio.run(run(args, veth, None))
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
