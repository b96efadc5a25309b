"""``istos record QUEUE --seconds N -o FILE``: save a queue's live events as a replayable trace.

The command follows the owner's event stream (as ``istos follow`` does) for ``N`` seconds, asks
the owner for the queue's policy (``stats``) and writes both as a trace file
(:mod:`istos.tracefile`), which ``istos_nb.sim.Trace.load`` reads and
``istos_nb.sim.replay`` runs. It lives in ``istos`` (the CLI never imports ``istos_nb``), which
is why the trace format does too. ``--bodies`` also polls the owner's waiting jobs once a second
and keeps each body seen (size and decoded data); jobs claimed between two polls have none.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from .. import tracefile
from ..errors import ConfigError
from .operator import Operator, decode_body

BODY_POLL_S = 1.0
MAX_EVENTS = 2_000_000  # beyond this a recording stops taking events and says how many it lost


def add_command(sub: Any, common: Any) -> None:
    """Declare ``record`` on the CLI's subparsers (``common`` adds --zenoh/--prefix...)."""
    p = sub.add_parser("record", help="save a queue's live events as a replayable trace",
                       description="follow a queue for N seconds and write a trace file "
                                   "(JSON lines; gzip when FILE ends in .gz) for "
                                   "istos_nb.sim.replay")
    p.add_argument("queue", metavar="QUEUE")
    common(p)
    p.add_argument("--seconds", type=float, required=True, help="how long to record")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the trace file")
    p.add_argument("--bodies", action="store_true",
                   help="also keep job bodies (polled once a second while they wait)")


async def record(op: Operator, queue: str, seconds: float, *, bodies: bool = False
                 ) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """Follow ``queue`` for ``seconds``; ``(header, events, bodies)`` for a trace file."""
    if not 0 < seconds < float("inf"):
        raise ConfigError(f"--seconds must be > 0, got {seconds!r}")
    policy = (await op.stats(queue)).get("policy") or {}
    events: list[dict[str, Any]] = []
    seen: dict[str, dict[str, Any]] = {}
    dropped = 0
    started = op.now()

    async def pump() -> None:
        nonlocal dropped
        async for event in op.follow(queue):
            if len(events) < MAX_EVENTS:
                events.append(event)
            else:
                dropped += 1

    tasks = [asyncio.create_task(pump())]
    if bodies:
        tasks.append(asyncio.create_task(_poll_bodies(op, queue, seen)))
    try:
        await asyncio.sleep(seconds)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    good = []
    for n, event in enumerate(events):
        try:
            good.append(tracefile.check_event(event, f"event {n}"))
        except tracefile.TraceFormatError:
            dropped += 1  # a malformed event from the wire is counted, never written
    head = tracefile.header(queue, policy, good, started=started, ended=op.now(),
                            source="follow", dropped=dropped)
    return head, good, list(seen.values())


async def _poll_bodies(op: Operator, queue: str, seen: dict[str, dict[str, Any]]) -> None:
    while True:
        for state in ("ready", "delayed"):
            try:
                rows, _, _ = await op.jobs(queue, state, None, None, 0)
            except Exception:  # a busy owner misses a poll; the next one tries again
                continue
            for row in rows:
                job_id, raw = str(row.get("job_id")), row.get("body")
                if job_id not in seen and isinstance(raw, bytes):
                    seen[job_id] = {"body_of": job_id, "size": len(raw),
                                    "data": _json_safe(decode_body(raw))}
        await asyncio.sleep(BODY_POLL_S)


def _json_safe(value: Any) -> Any:
    return value.hex() if isinstance(value, bytes) else value


async def run_record(op: Operator, args: argparse.Namespace, out: Any) -> int:
    """The ``record`` command: write the trace and say what it holds."""
    head, events, bodies = await record(op, args.queue, args.seconds, bodies=args.bodies)
    try:
        tracefile.write_trace(args.output, head, events, bodies)
    except OSError as exc:
        raise ConfigError(f"cannot write {args.output!r}: {exc.strerror or exc}") from exc
    jobs = len({e["job_id"] for e in events if e["kind"] == "enqueued"})
    out.write(f"recorded {len(events)} events ({jobs} jobs enqueued"
              + (f", {len(bodies)} bodies" if args.bodies else "")
              + (f", {head['dropped']} dropped" if head["dropped"] else "")
              + f") of {args.queue} to {args.output}\n")
    return 0
