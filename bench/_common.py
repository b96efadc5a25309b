"""What both package drivers share: the job shape, Zenoh isolation, timing and the command loop.

This module imports nothing from ``istos``: it is loaded by ``_driver_ours.py`` (our package) and
by ``_driver_ref.py`` (the reference package, in ``bench/.ref-venv``), which both run as scripts
so that ``bench/`` -- not the repository root -- is first on ``sys.path``.

Driver protocol (one driver process per package, kept for the whole bench invocation):
the orchestrator writes one JSON command per line on the driver's stdin, e.g.
``{"cmd": "e2e", "jobs": 2000, "concurrency": 8}``, and the driver answers with exactly one line
``@@RESULT {...}`` on stdout (``{"error": "..."}`` when the run failed). ``{"cmd": "quit"}`` or
EOF ends the driver.
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import socket
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

RESULT_TAG = "@@RESULT "
READY_TAG = "@@READY"
BODY_BYTES = 100  # the encoded size the jobs aim at (msgpack for ours, JSON for the reference)

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


# -- the jobs ---------------------------------------------------------------------------------
def make_job(i: int) -> dict[str, Any]:
    """A small job body: about 100 bytes encoded, msgpack or JSON alike."""
    return {"i": i, "pad": "x" * 78}


async def noop_handler(job: Any) -> None:
    """The worker of every throughput workload: an async function that returns at once."""
    return None


def unique_prefix() -> str:
    """A key prefix no other run (or test, or bench invocation) uses."""
    return f"istos-bench/{secrets.token_hex(6)}"


# -- Zenoh isolation ----------------------------------------------------------------------------
def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picked it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def zenoh_configs(n: int) -> list[dict[str, Any]]:
    """Configs for ``n`` peers forming a private full mesh on loopback.

    The same shape as ``tests/zenoh_util.isolated_configs`` (which our driver prefers when it
    imports; the reference's venv cannot import it): multicast scouting and gossip off, node ``i``
    listens on its own port and connects to every earlier node, so no other mesh on the host --
    a test run, another benchmark -- can join.
    """
    endpoints = [f"tcp/127.0.0.1:{free_port()}" for _ in range(n)]
    return [
        {
            "mode": "peer",
            "scouting": {
                "multicast": {"enabled": False},
                "gossip": {"enabled": False},
                "delay": 20,
            },
            "listen": {"endpoints": [endpoints[i]]},
            "connect": {"endpoints": endpoints[:i]},
        }
        for i in range(n)
    ]


# -- figures ------------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between closest ranks."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    if lo == hi:
        return ordered[lo]
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def latency_figures(samples_s: list[float]) -> dict[str, float]:
    """p50/p99/mean/max in milliseconds of per-call durations given in seconds."""
    ms = [s * 1e3 for s in samples_s]
    return {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
            "mean_ms": sum(ms) / len(ms), "max_ms": max(ms), "n": len(ms)}


class Completion:
    """Counts acks recorded by the owner and wakes whoever waits for the last one.

    Call :meth:`hit` on the event loop once per ack the owner has recorded. ``t_last`` is the
    ``perf_counter`` of the ``target``-th ack.
    """

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.t_last: float | None = None
        self.done = asyncio.Event()

    def hit(self) -> None:
        self.count += 1
        if self.count == self.target:
            self.t_last = time.perf_counter()
            self.done.set()

    async def wait(self, timeout_s: float) -> float:
        """Wait for the last ack; return its time. TimeoutError names how far it got."""
        try:
            await asyncio.wait_for(self.done.wait(), timeout_s)
        except asyncio.TimeoutError:
            raise TimeoutError(f"only {self.count} of {self.target} jobs acked within "
                               f"{timeout_s:g} s") from None
        assert self.t_last is not None
        return self.t_last


def throughput(jobs: int, t0: float, t1: float) -> dict[str, float]:
    elapsed = t1 - t0
    return {"jobs": jobs, "elapsed_s": elapsed, "jobs_per_s": jobs / elapsed}


def deadline_for(jobs: int) -> float:
    """A generous bound for one throughput run (the reference has run at ~250 jobs/s here)."""
    return 30.0 + jobs / 50.0


# -- subprocess plumbing (asyncio, no threads: the reference's queue calls share the default
# executor, and a thread parked on a pipe would take one of its six slots) ---------------------
async def stdin_reader() -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def read_tagged(stream: asyncio.StreamReader, tag: str, timeout_s: float) -> str:
    """Read lines until one starts with ``tag``; return the rest of it. Other lines go to stderr
    (a child's stray prints must not be mistaken for its answer)."""
    async def scan() -> str:
        while True:
            raw = await stream.readline()
            if not raw:
                raise RuntimeError(f"child closed its stdout before {tag.strip()!r}")
            line = raw.decode("utf-8", "replace").rstrip("\n")
            if line.startswith(tag):
                return line[len(tag):]
            print(f"[child] {line}", file=sys.stderr)

    return await asyncio.wait_for(scan(), timeout_s)


class WorkerProcess:
    """Process B of the two-process workload: the same driver script in ``worker`` mode."""

    def __init__(self, script: str, spec: dict[str, Any]) -> None:
        self.script = script
        self.spec = spec
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self, timeout_s: float = 60.0) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-u", self.script, "worker", json.dumps(self.spec),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        assert self.proc.stdout is not None
        await read_tagged(self.proc.stdout, READY_TAG, timeout_s)

    async def stop(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Ask B to stop serving; return the stats it reports."""
        proc = self.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"stop\n")
        await proc.stdin.drain()
        stats = json.loads(await read_tagged(proc.stdout, RESULT_TAG, timeout_s))
        await asyncio.wait_for(proc.wait(), timeout_s)
        return stats

    async def kill(self) -> None:
        proc = self.proc
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.wait()


async def wait_for_stop_line() -> None:
    """In process B: return when the parent writes a line (or closes our stdin)."""
    reader = await stdin_reader()
    await reader.readline()


async def wait_until(pred: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    """Poll ``pred`` every 5 ms (only for conditions with nothing to await)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + timeout_s
    while not pred():
        if loop.time() > until:
            raise TimeoutError(f"not within {timeout_s:g} s: {what}")
        await asyncio.sleep(0.005)


def report_ready() -> None:
    print(READY_TAG, flush=True)


def report(result: dict[str, Any]) -> None:
    print(RESULT_TAG + json.dumps(result), flush=True)


# -- the command loop ---------------------------------------------------------------------------
def serve_commands(handlers: dict[str, Handler], about: dict[str, Any]) -> None:
    """Answer the orchestrator's commands, one fresh event loop per command.

    ``about`` answers the ``hello`` command (which package, where it was imported from).
    """
    for raw in sys.stdin:
        line = raw.strip()
        if not line:
            continue
        cmd = json.loads(line)
        name = cmd.get("cmd")
        if name == "quit":
            break
        if name == "hello":
            report(about)
            continue
        handler = handlers.get(name)
        if handler is None:
            report({"error": f"unknown command {name!r}"})
            continue
        try:
            result = asyncio.run(handler(cmd))
        except Exception as exc:  # a failed run is reported, the driver lives on
            traceback.print_exc(file=sys.stderr)
            result = {"error": f"{type(exc).__name__}: {exc}"}
        report(result)
