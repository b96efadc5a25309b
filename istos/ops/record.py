"""``istos record QUEUE --seconds N -o FILE``: save a queue's live events as a replayable trace.

One concept at three layers: the recording is ``client/record.py``; this writes it as a
file for the CLI; ``istos_nb/live/record.py`` builds a Trace of it.

The command records the queue (:func:`istos.client.record.record`: its events for ``N``
seconds and its policy) and writes it as a trace file (:mod:`istos.tracefile`), which
``istos_nb.sim.Trace.load`` reads and ``istos_nb.sim.replay`` runs. It lives in ``istos`` (the
CLI never imports ``istos_nb``), which is why the trace format does too. ``--bodies`` also polls
the owner's waiting jobs once a second and keeps each body seen (size and decoded data); jobs
claimed between two polls have none.
"""

from __future__ import annotations

import argparse
from typing import Any

from .. import tracefile
from ..client.record import record
from ..errors import ConfigError
from .operator import Operator


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


async def run_record(op: Operator, args: argparse.Namespace, out: Any) -> int:
    """The ``record`` command: write the trace and say what it holds."""
    rec = await record(op.transport, op.client(args.queue), args.seconds, bodies=args.bodies)
    head, events, bodies = rec.header, rec.events, rec.bodies
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
