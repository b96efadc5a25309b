"""``istos batches QUEUE`` and ``istos batch BATCH_ID``: batches as their home owner holds them.

Read-only (``batches``, ``batch_status`` and ``batch_members`` ops, on the read key). A batch id
names its home queue (``wf:<hex>@<queue>``), so ``istos batch`` needs no queue argument.
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Callable
from typing import Any

from ..core import batch_state as bs
from ..errors import JobNotFound
from .operator import Operator

Emit = Callable[[Any, argparse.Namespace, Any, str], int]


def add_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Declare the two commands on the CLI's parser (``command`` is cli.parser's helper)."""
    p = command("batches", "the batches a queue is home to: open ones first, with counts")
    p.add_argument("--limit", type=int, default=50, help="rows to show (default 50)")
    p = command("batch", "one batch: counts, callbacks, and members by state", "none")
    p.add_argument("batch_id", metavar="BATCH_ID")
    p.add_argument("--state", choices=["pending", "done", "dead", "cancelled"], default=None,
                   help="list only the members in this state (default: pending ones)")
    p.add_argument("--limit", type=int, default=20, help="members to list (default 20)")


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _counts(b: dict[str, Any]) -> str:
    return (f"{b['total']} members: {b['pending']} pending, {b['done']} done, "
            f"{b['dead']} dead, {b['cancelled']} cancelled")


def _callbacks(b: dict[str, Any]) -> str:
    return ", ".join(f"{kind} -> {cb['queue']} "
                     f"({'fired ' + _when(cb['fired_at']) if cb['fired_at'] else 'not fired'})"
                     for kind, cb in b["callbacks"].items()) or "no callbacks"


async def batches(op: Operator, args: argparse.Namespace, out: Any, emit: Emit) -> int:
    """``istos batches QUEUE``."""
    reply = await op.call(args.queue, "batches", limit=max(1, min(args.limit, 1000)))
    rows = reply["batches"]
    lines = [f"queue {args.queue}: home to {reply['total']} batch(es)"
             + (f", {len(rows)} shown" if len(rows) < reply["total"] else "")]
    for b in rows:
        state = "open" if not b["closed"] else (
            "finished" if b["finished_at"] is not None else "closed")
        lines.append(f"  {b['batch_id']}  {state:8}  {_counts(b)}"
                     + (f"  {b['description']!r}" if b["description"] else ""))
    return emit(out, args, reply, "\n".join(lines))


async def batch(op: Operator, args: argparse.Namespace, out: Any, emit: Emit) -> int:
    """``istos batch BATCH_ID``."""
    home = bs.home_of(args.batch_id)
    status = (await op.call(home, "batch_status", batch_id=args.batch_id))["batch"]
    if status is None:
        raise JobNotFound(f"queue {home!r} holds no batch {args.batch_id!r}")
    state = args.state or "pending"
    members = await op.call(home, "batch_members", batch_id=args.batch_id, state=state,
                            limit=max(1, min(args.limit, 1000)))
    lines = [f"batch {args.batch_id}" + (f" ({status['description']})"
                                         if status["description"] else ""),
             f"  home {home}, {'closed' if status['closed'] else 'open'}, created "
             f"{_when(status['created_at'])}, finished {_when(status['finished_at'])}",
             *([f"  a member of batch {status['parent_id']}"] if status.get("parent_id")
               else []),
             f"  {_counts(status)}", f"  callbacks: {_callbacks(status)}",
             f"  {state} members" + (" (first shown)" if members["more"] else "") + ":"]
    lines += [f"    {m['queue']}  {m['job_id']}" for m in members["members"]] or ["    none"]
    if state == "pending" and status["closed"] and status["pending"]:
        lines.append("  waits for the pending members above to end")
    return emit(out, args, {**status, "members": members["members"],
                            "members_more": members["more"]}, "\n".join(lines))
