"""The operator commands kept apart from ``cli.py``: ``istos workers``,
``istos redrive-dead``, ``istos promote``, the ``--older-than`` of ``purge-dead`` and the
search options of ``jobs`` (``--error``, ``--worker``, ``--enqueued-after``, ...).

Bulk actions are one bounded request each on the owner (at most a thousand jobs); the command
repeats it until the owner says nothing is left, and prints the total.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import urllib.parse
from collections.abc import Callable
from typing import Any

from ..owner.views.workflow_view import fill_states
from . import render as R
from .discovery import queue_rows
from .operator import Operator

Command = Callable[..., argparse.ArgumentParser]
MAX_ROUNDS = 100_000  # bulk requests one command sends at most (a hundred million jobs)
_AGE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)?\s*", re.IGNORECASE)
_UNIT_S = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_age(text: str) -> float:
    """``"90"``, ``"90s"``, ``"15m"``, ``"1h"``, ``"2d"``, ``"1w"`` as seconds (ValueError)."""
    match = _AGE.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not an age: write 90s, 15m, 1h, 2d or 1w")
    return float(match.group(1)) * _UNIT_S[(match.group(2) or "s").lower()]


def parse_instant(text: str, now: float) -> float:
    """An instant as epoch seconds: an age back from now (``1h``: an hour ago), epoch seconds
    (``1764547200``) or an ISO date/time (local time when it names no zone)."""
    try:
        value = float(text)
        if value > 1e8:  # epoch seconds (after 1973), not an age in seconds
            return value
    except ValueError:
        pass
    try:
        return now - parse_age(text)
    except ValueError:
        pass
    try:
        return dt.datetime.fromisoformat(text).astimezone().timestamp()
    except ValueError:
        raise ValueError(f"{text!r} is not an instant: write an age (1h), epoch seconds or an "
                         "ISO date (2026-12-01T10:00)") from None


def add_commands(command: Command) -> None:
    """Declare this module's sub-commands (``command`` is ``cli.parser``'s factory)."""
    command("workers", "worker nodes that claimed or renewed lately: slots, held jobs, counts "
            "(none given: every queue discovered)", "any")
    command("queues", "every queue under the prefix: owner, HA role, counts, rates", "none")
    p = command("redrive-dead", "admin: dead letters back to ready under their own ids "
                "(afresh)")
    p.add_argument("--error", metavar="TEXT", help="only those whose last error contains TEXT")
    p.add_argument("--all", action="store_true", help="every dead letter")
    p = command("promote", "admin: delayed jobs ready now (the given ids, or all)")
    p.add_argument("job_ids", nargs="*", metavar="JOB_ID")


def add_search_options(p: argparse.ArgumentParser) -> None:
    """``jobs``' search options (besides ``--state`` and ``--where``)."""
    p.add_argument("--error", metavar="TEXT", help="last error contains TEXT")
    p.add_argument("--worker", metavar="TEXT", help="some attempt's worker contains TEXT")
    for what in ("enqueued", "finished"):
        for end in ("after", "before"):
            p.add_argument(f"--{what}-{end}", metavar="WHEN", help=f"{what} at or {end} WHEN "
                           "(an age like 1h, epoch seconds, or an ISO date)")


def search_fields(args: argparse.Namespace, now: float,
                  bad: Callable[[str], Exception]) -> dict[str, Any]:
    """The ``jobs`` request fields of the search options given (``bad`` builds the error)."""
    fields: dict[str, Any] = {}
    for name in ("error", "worker"):
        value = getattr(args, name, None)
        if value is not None:
            if not value:
                raise bad(f"--{name} needs some text")
            fields[name] = value
    for what in ("enqueued", "finished"):
        for end in ("after", "before"):
            raw = getattr(args, f"{what}_{end}", None)
            if raw is not None:
                try:
                    fields[f"{what}_{end}"] = parse_instant(raw, now)
                except ValueError as exc:
                    raise bad(f"--{what}-{end}: {exc}") from None
    return fields


async def bulk(op: Operator, queue: str, name: str, count_key: str, **fields: Any) -> int:
    """Repeat one bulk admin request until the owner says none is left; the total changed."""
    total = 0
    for _ in range(MAX_ROUNDS):
        reply = await op.call(queue, name, **fields)
        total += int(reply[count_key])
        if not reply.get("more") or not reply[count_key]:
            break
    return total


async def why(op: Operator, queue: str, job_id: str) -> dict[str, Any]:
    """The owner's ``why``; a workflow step's workflow gets every job's state (``jobs``)."""
    out = dict((await op.call(queue, "why", job_id=job_id))["why"])
    flow = out.get("workflow")
    if isinstance(flow, dict):
        flow["jobs"] = await fill_states(flow, op.call)
    return out


def dashboard_link(queue: str, job_id: str) -> str:
    """``"\\n  open: URL?queue=Q&job=ID"`` when ``ISTOS_DASHBOARD_URL`` names the address
    ``istos dashboard`` serves on, else nothing."""
    base = os.environ.get("ISTOS_DASHBOARD_URL", "").strip()
    if not base:
        return ""
    query = urllib.parse.urlencode({"queue": queue, "job": job_id})
    return f"\n  open: {base.rstrip('/')}/?{query}"


async def workers(op: Operator, args: argparse.Namespace, out: Any,
                  emit: Callable[..., int]) -> int:
    tables = {q: await op.workers(q) for q in await op.queue_names(args.queue)}
    text = "\n\n".join(f"queue {q}\n{workers_text(rows, op.now())}" for q, rows in tables.items())
    return emit(out, args, tables, text)


async def queues(op: Operator, args: argparse.Namespace, out: Any,
                 emit: Callable[..., int]) -> int:
    rows = await queue_rows(op)
    return emit(out, args, {"queues": rows}, queues_text(rows))


async def redrive_dead(op: Operator, args: argparse.Namespace, out: Any,
                       emit: Callable[..., int], bad: Callable[[str], Exception]) -> int:
    if bool(args.all) == (args.error is not None):
        raise bad("redrive-dead: give --error TEXT or --all (not both)")
    fields = {} if args.all else {"error": args.error}
    n = await bulk(op, args.queue, "requeue_all_dead", "requeued", **fields)
    # --json keeps the wire's field name (``requeued``) for scripts written against it.
    return emit(out, args, {"requeued": n}, f"{n} dead letter(s) back to ready")


async def promote(op: Operator, args: argparse.Namespace, out: Any,
                  emit: Callable[..., int]) -> int:
    if args.job_ids:
        n = int((await op.call(args.queue, "promote", job_ids=list(args.job_ids)))["promoted"])
    else:
        n = await bulk(op, args.queue, "promote", "promoted")
    return emit(out, args, {"promoted": n}, f"promoted {n} delayed job(s) to ready")


async def purge_older(op: Operator, args: argparse.Namespace, out: Any,
                      emit: Callable[..., int], bad: Callable[[str], Exception]) -> int:
    try:
        age = parse_age(args.older_than)
    except ValueError as exc:
        raise bad(f"--older-than: {exc}") from None
    n = await bulk(op, args.queue, "purge_dead_older", "purged", older_than_s=age)
    return emit(out, args, {"purged": n},
                f"purged {n} dead letter(s) older than {R.duration(age)}")


def queues_text(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no queue found under this prefix"
    states = ("ready", "delayed", "leased", "done", "dead")
    return R.table(
        ["queue", "owner", "role", *states, "enq/s", "ack/s", "workers"],
        [[r["queue"], r.get("owner") or "(no answer)",
          r["role"] + (f" ({len(r['replicas'])} replicas)" if r["replicas"] else ""),
          *((r.get("counts") or {}).get(s, "") for s in states),
          "" if r.get("enqueue_rate") is None else f"{r['enqueue_rate']:.1f}",
          "" if r.get("ack_rate") is None else f"{r['ack_rate']:.1f}",
          r.get("workers", "")] for r in rows])


def workers_text(rows: list[dict[str, Any]], now: float) -> str:
    if not rows:
        return "no worker seen lately"

    def conf(r: dict[str, Any]) -> str:
        if r.get("concurrency") is None:
            return "?"
        pre = r.get("prefetch")
        pre_text = "auto" if pre == -1 else str(pre)
        return f"{r['concurrency']}+{pre_text}" + (" hb" if r.get("heartbeat") else "")

    return R.table(
        ["worker", "slots", "conc+prefetch", "held", "last seen", "first seen", "acked",
         "nacked", "expired", "released"],
        [[r["worker"], r.get("slots") or "?", conf(r),
          f"{r.get('held_count', 0)}" + (f" ({R.cut(','.join(r.get('held') or []), 30)})"
                                         if r.get("held") else ""),
          R.when(r.get("last_seen"), now), R.when(r.get("first_seen"), now), r.get("acked"),
          r.get("nacked"), r.get("expired"), r.get("released")] for r in rows])
