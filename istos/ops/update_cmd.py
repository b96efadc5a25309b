"""``istos update QUEUE JOB_ID [--data JSON] [--delay-s S] [--priority P]``: edit a waiting
(ready or delayed) job in one request, as ``Istos.update`` does; the produce role may."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from ..errors import ConfigError
from ..lifecycle import UNSET, check_update
from .operator import Operator

Emit = Callable[[Any, argparse.Namespace, Any, str], int]

_WORDS = {"updated": "updated", "too_late": "too late: it started already (nothing changed)",
          "unknown": "unknown: the queue holds no such job"}


def add_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """Declare ``update`` with the CLI's ``command(name, help)``."""
    p = command("update", "edit a waiting (ready or delayed) job: its data, start or priority, "
                "in one durable write")
    p.add_argument("job_id", metavar="JOB_ID")
    p.add_argument("--data", default=None, metavar="JSON", help="the job's new data (JSON)")
    p.add_argument("--delay-s", type=float, default=None, metavar="S",
                   help="start S seconds from now (0: ready at once)")
    p.add_argument("--priority", type=int, default=None, metavar="P",
                   help="the new priority (higher first)")


def update_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The op's fields from the parsed arguments, checked before anything is sent. Raises
    ConfigError (exit 2) naming ``--data`` for text that is not JSON, or the field
    ``Istos.update`` refuses (nothing to change, a bad ``delay_s`` or ``priority``)."""
    data: Any = UNSET
    if args.data is not None:
        try:
            data = json.loads(args.data)
        except ValueError as exc:
            raise ConfigError(f"--data must be JSON: {exc}") from None
    return check_update(args.queue, args.job_id, data, args.delay_s, None, args.priority)


async def update(op: Operator, args: argparse.Namespace, out: Any, emit: Emit,
                 resolve: Callable[[Operator, str, str], Any],
                 unknown: Callable[[str], Exception]) -> int:
    """Run ``istos update``; the exit status. ``resolve`` turns a job id prefix into the id;
    a job the queue does not hold raises ``unknown(message)`` (exit 1); ``too_late`` is an
    answer (exit 0, nothing changed). Raises ConfigError (exit 2, nothing sent) for bad
    arguments (see :func:`update_fields`)."""
    fields = update_fields(args)
    job_id = await resolve(op, args.queue, args.job_id)
    status = str((await op.call(args.queue, "update", job_id=job_id, **fields))["status"])
    if status == "unknown":
        raise unknown(f"queue {args.queue!r} holds no job {job_id!r}")
    return emit(out, args, {"job_id": job_id, "status": status},
                f"{job_id}: {_WORDS.get(status, status)}")
