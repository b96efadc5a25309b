"""``istos pause QUEUE [--reason WHY] [--by WHO] [--group G]`` and ``istos resume QUEUE
[--group G]``: one admin request each; the owner stores the pause before claims see it."""

from __future__ import annotations

import argparse
import getpass
import socket
from collections.abc import Callable
from typing import Any

from ..client.pausing import pause_fields, resume_fields
from .operator import Operator
from .pause_view import pause_phrase

Emit = Callable[[Any, argparse.Namespace, Any, str], int]


def default_by() -> str:
    """``USER@HOST`` of the operator running the command (what ``--by`` defaults to)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container)
        user = "?"
    return f"{user}@{socket.gethostname()}"[:200]


def add_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Declare ``pause`` and ``resume`` with the CLI's ``command(name, help)``."""
    p = command("pause", "admin: stop claims on a queue (or one group); stored, so it "
                "outlasts an owner restart or failover")
    p.add_argument("--reason", default=None, help="why (shown in stats, the dashboard, "
                   "metrics and events; up to 500 bytes)")
    p.add_argument("--by", default=None, help="who (default: USER@HOST)")
    p.add_argument("--group", default=None, help="pause only this fairness group")
    p = command("resume", "admin: let workers claim again")
    p.add_argument("--group", default=None, help="resume only this fairness group")


async def pause_resume(op: Operator, args: argparse.Namespace, out: Any, emit: Emit) -> int:
    """Run ``istos pause`` or ``istos resume`` (``args.command``); the exit status.
    Raises ConfigError (exit 2, nothing sent) for a bad ``--reason``, ``--by`` or ``--group``."""
    group = getattr(args, "group", None)
    what = f"queue {args.queue}" + (f" group {group}" if group else "")
    if args.command == "pause":
        fields = pause_fields(reason=args.reason, by=args.by or default_by(), group=group)
        reply = await op.call(args.queue, "pause", **fields)
        pause = reply.get("pause")
        phrase = pause_phrase(pause)
        return emit(out, args, {"paused": True, "group": group, "pause": pause},
                    f"{what} paused" + (f" {phrase}" if phrase else ""))
    reply = await op.call(args.queue, "resume", **resume_fields(group=group))
    was = reply.get("was")
    return emit(out, args, {"paused": False, "group": group, "was": was},
                f"{what} resumed" if was is not None else f"{what} was not paused")
