"""``istos``, the operator's command line: look at live queues without writing Python.

``istos stats|jobs|why|dead|leases|follow QUEUE [...] --zenoh CONFIG --prefix P [--json]``, the
admin commands ``resubmit``, ``purge-dead``, ``pause``, ``resume``, ``cancel`` (refused unless
the queue was declared with ``admin=True``), ``istos metrics QUEUE... --port N`` (Prometheus text on
``/metrics``), ``istos dashboard QUEUE`` (the LiveDashboard through Voila on 127.0.0.1) and
``istos record QUEUE --seconds N -o FILE`` (a trace for ``istos_nb.sim.replay``: record.py).

Tables are for people (local times, ages, one-line payloads); ``--json`` prints one JSON document
(``follow``: one JSON object per line) with epoch seconds, for scripts. Exit status: 0 success,
1 the owner refused (admin disabled, no such job), 2 bad usage, 3 no owner answered (of several
queues: none did); errors are one line on stderr, never a traceback, and with ``--json`` also a
JSON object ``{"error": TYPE, "message": ...}`` on stdout. Job ids may be given as a unique
prefix of at least 6 characters (``why``, ``cancel``, ``update``, ``resubmit``), as demos and
charts print them. Renamed commands keep their old names, unlisted, for one release
(:data:`OLD_COMMANDS`). Nothing here imports ``istos_nb`` (``dashboard`` starts Voila, whose kernel
does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..cancel_guard import within
from ..client.follow import MARKERS
from ..core.state import STATES
from ..errors import AdminDisabled, ConfigError, IstosError, JobNotFound, OwnerUnavailable
from ..protocol import MIN_ID_PREFIX
from . import batch_cmds as BC
from . import operator_cmds as OC
from . import pause_cmd, update_cmd
from . import render as R
from .operator import Operator
from .record import add_command as add_record_command
from .record import run_record

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_NO_OWNER = 0, 1, 2, 3
OLD_COMMANDS = {"requeue": "resubmit", "requeue-dead": "redrive-dead"}
"""Old command names that still work, unlisted, for one release: old name -> the command."""


class UsageError(ConfigError):
    """Bad arguments (exit 2)."""


class UnknownJob(JobNotFound):
    """The queue holds no such job (exit 1; ``--json``: ``{"error": "UnknownJob", ...}``)."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises :class:`UsageError` instead of exiting, so ``--json`` can answer
    bad usage with a JSON object like every other outcome."""

    def error(self, message: str) -> Any:  # argparse's signature says NoReturn
        raise UsageError(f"{message} (see: {self.prog} --help)")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--zenoh", metavar="CONFIG", default=None,
                   help="Zenoh config: a JSON5 file or inline JSON5 (default: peer mode with "
                        "multicast scouting)")
    p.add_argument("--prefix", default="istos", help="the key prefix the owner uses")
    p.add_argument("--timeout", type=float, default=5.0, metavar="S",
                   help="seconds to wait for an owner (default 5)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _outbox_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--outbox", metavar="URL", default=None,
                   help="also report the outbox table at this SQLAlchemy async URL "
                        "(istos_outbox_depth, istos_outbox_oldest_age_seconds)")
    p.add_argument("--outbox-table", default="istos_outbox", metavar="TABLE")


def _more_commands(command: Any) -> None:
    """The commands other modules declare (operator_cmds.py, batch_cmds.py)."""
    OC.add_commands(command)
    BC.add_commands(command)


# ``old_names=False`` leaves out OLD_COMMANDS: the reference documents the current names only.
def parser(old_names: bool = True) -> argparse.ArgumentParser:
    top = _Parser(
        prog="istos", description="Look at live Istos queues (and, where a queue allows it, "
        "act on them) without writing Python. Exit status: 0 ok, 1 refused by the owner, "
        "2 bad usage, 3 no owner answered.")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_: str, queues: str = "one") -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        if queues in ("many", "any"):  # any: none given means every queue discovered
            p.add_argument("queue", nargs="+" if queues == "many" else "*", metavar="QUEUE")
        elif queues in ("one", "opt"):
            p.add_argument("queue", metavar="QUEUE", nargs=None if queues == "one" else "?")
        _common(p)
        return p

    command("stats", "counts, rates, totals and policy of queues (none given: every queue "
            "discovered)", "any")
    p = command("jobs", "jobs an owner holds (paged: says what was left out)")
    p.add_argument("--state", choices=list(STATES))
    p.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                   help="payload field match (dotted keys, JSON values); repeatable")
    p.add_argument("--limit", type=int, default=50, help="rows to show; 0 for all (default 50)")
    p.add_argument("--offset", type=int, default=0)
    OC.add_search_options(p)
    p = command("why", "why a job is (not) running")
    p.add_argument("job_id", metavar="JOB_ID")
    p = command("dead", "dead letters, oldest first")
    p.add_argument("--limit", type=int, default=0, help="rows to show; 0 for all (default)")
    command("leases", "live leases")
    p = command("series", "the owner's time series: counts, events, wait/run quantiles")
    p.add_argument("--since", type=float, default=None, metavar="S",
                   help="only the last S seconds (default: all the owner keeps)")
    p.add_argument("--resolution", choices=["1s", "1min"], default="1s")
    p.add_argument("--limit", type=int, default=20,
                   help="table rows to show, newest last; 0 for all (default 20; --json: all)")
    p = command("follow", "print live events as they happen (Ctrl-C stops)")
    p.add_argument("--count", type=int, default=0, help="stop after N events (0: never)")
    p.add_argument("--seconds", type=float, default=0.0, help="stop after S seconds (0: never)")
    p = command("resubmit", "admin: enqueue a dead job's body again as a new job (a new id)")
    p.add_argument("job_id", metavar="JOB_ID")
    p = command("purge-dead", "admin: delete dead letters (the given ids, or --all)")
    p.add_argument("job_ids", nargs="*", metavar="JOB_ID")
    p.add_argument("--all", action="store_true", help="delete every dead letter")
    p.add_argument("--older-than", metavar="AGE", help="those that died at least AGE ago "
                   "(90s, 15m, 1h, 2d), in bounded requests")
    pause_cmd.add_commands(command)
    p = command("cancel", "admin: cancel a job (a running one is stopped by its worker)")
    p.add_argument("job_id", metavar="JOB_ID")
    update_cmd.add_commands(command)
    p = command("metrics", "serve Prometheus metrics of queues on /metrics (read-only; none "
                "given: every queue discovered at each scrape)", "any")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--budget", type=float, default=None, metavar="S",
                   help="seconds each queue has to answer a scrape (default 0.3); one that "
                        "does not is reported istos_owner_up 0")
    _outbox_args(p)
    p = command("dashboard", "serve the LiveDashboard page through Voila on 127.0.0.1 (no "
                "queue: an overview of every queue, each row opening its dashboard)", "opt")
    p.add_argument("--port", type=int, default=8866)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind (default 127.0.0.1; others get a warning)")
    p.add_argument("--no-token", action="store_true",
                   help="serve without a token (default: a random one, in the printed URL)")
    p.add_argument("--cull-after", type=float, default=None, metavar="S",
                   help="end a closed page's kernel after S seconds idle (default 60)")
    _more_commands(command)
    add_record_command(sub, _common)
    return _with_old_names(top, sub) if old_names else top


def documented_parser() -> argparse.ArgumentParser:
    """The parser as docs/reference/cli.rst documents it: without the old command names."""
    return parser(old_names=False)


def _with_old_names(top: argparse.ArgumentParser, sub: Any) -> argparse.ArgumentParser:
    """``top`` with each of :data:`OLD_COMMANDS` parsed as the command it names (its
    arguments copied); given no help, argparse leaves them out of the listing."""
    for old, new in OLD_COMMANDS.items():
        alias = sub.add_parser(old, parents=[sub.choices[new]], add_help=False,
                               description=f"the old name of `istos {new}` (kept one release)")
        alias.set_defaults(command=new)
    return top


def parse_where(terms: Iterable[str],
                bad: Callable[[str], Exception] | None = None) -> dict[str, Any]:
    """``KEY=VALUE`` terms as a ``where`` dict; values parsed as JSON when they are (7, true,
    "x"), else kept as text. A term without ``=`` raises ``bad(term)`` (default: UsageError)."""
    where: dict[str, Any] = {}
    for term in terms:
        key, sep, raw = term.partition("=")
        if not sep or not key:
            if bad is not None:
                raise bad(term)
            raise UsageError(f"--where {term!r}: write KEY=VALUE (dotted keys: user.id=7)")
        try:
            where[key] = json.loads(raw)
        except ValueError:
            where[key] = raw
    return where


async def run(args: argparse.Namespace, out: Any) -> int:
    """Run one parsed command, writing to ``out``; returns the exit status."""
    if args.command == "metrics":
        from .metrics import serve_metrics  # prometheus-client only for those who ask

        return await serve_metrics(args, out)
    async with Operator(args.zenoh, prefix=args.prefix, timeout_s=args.timeout) as op:
        if args.command == "dashboard":
            if args.queue:  # fail fast (exit 3) when nobody serves the queue
                await op.stats(args.queue)
        else:
            handler = _HANDLERS[args.command]
            return await handler(op, args, out)
    # The dashboard's kernels have sessions of their own: this one is closed while Voila
    # serves, so stopping is only Voila's (SIGTERM: about a second).
    from .dashboard import serve_dashboard

    return await serve_dashboard(args, out)


def _emit(out: Any, args: argparse.Namespace, data: Any, text: str) -> int:
    out.write((json.dumps(R.jsonable(data)) if args.json else text) + "\n")
    return EXIT_OK


async def _stats(op: Operator, args: argparse.Namespace, out: Any) -> int:
    """Every queue asked at once, each within the timeout: one that does not answer is named
    (a line of its own, an error object in JSON) and never delays or hides the others."""
    queues = list(dict.fromkeys(await op.queue_names(args.queue)))
    answers = await asyncio.gather(*(op.stats(q) for q in queues), return_exceptions=True)
    missing = {q: a for q, a in zip(queues, answers) if isinstance(a, OwnerUnavailable)}
    for a in answers:
        if isinstance(a, BaseException) and not isinstance(a, OwnerUnavailable):
            raise a
    if len(missing) == len(queues):
        raise next(iter(missing.values()))
    data = {q: (error_object(a) if isinstance(a, BaseException) else a)
            for q, a in zip(queues, answers)}
    for exc in missing.values():
        sys.stderr.write(f"istos: {one_line(exc)}\n")
    text = "\n\n".join(f"queue {q}: NO ANSWER ({one_line(a)})" if isinstance(a, BaseException)
                        else R.stats_text(a) for q, a in zip(queues, answers))
    return _emit(out, args, data, text)


async def resolve_id(op: Operator, queue: str, job_id: str) -> str:
    """``job_id`` itself, or the one id the queue holds that starts with it (a prefix of at
    least MIN_ID_PREFIX characters, as the demo and charts print them); several: UsageError."""
    if len(job_id) < MIN_ID_PREFIX:
        return job_id
    reply = await op.call(queue, "resolve", prefix=job_id)
    matches = [str(m) for m in reply["matches"]]
    if len(matches) > 1 or reply.get("more"):
        shown = ", ".join(matches) + (", ..." if reply.get("more") else "")
        raise UsageError(f"job id prefix {job_id!r} matches several jobs of queue {queue!r} "
                         f"({shown}): give more characters")
    return matches[0] if matches else job_id


async def _jobs(op: Operator, args: argparse.Namespace, out: Any) -> int:
    if args.limit < 0 or args.offset < 0:
        raise UsageError("--limit and --offset must be >= 0")
    notes: dict[str, int] = {}
    rows, total, truncated = await op.jobs(args.queue, args.state, parse_where(args.where),
                                           args.limit or None, args.offset,
                                           OC.search_fields(args, op.now(), UsageError), notes)
    data = {"jobs": rows, "total": total, "truncated": truncated, "offset": args.offset}
    text = R.jobs_text(rows, total, args.offset, op.now())
    if notes.get("unsearched"):  # payload codecs: the owner cannot read these bodies
        data["unsearched"] = notes["unsearched"]
        text += (f"\nnote: {notes['unsearched']} job bodies are encoded by payload codecs; "
                 "--where cannot look inside them, so none of them matched")
    return _emit(out, args, data, text)


async def _why(op: Operator, args: argparse.Namespace, out: Any) -> int:
    job_id = await resolve_id(op, args.queue, args.job_id)
    why = await OC.why(op, args.queue, job_id)
    if why.get("state") == "unknown":
        raise UnknownJob(f"queue {args.queue!r} holds no job {job_id!r}: {why.get('reason')}")
    return _emit(out, args, {"job_id": job_id, **why}, R.why_text(job_id, why)
                 + OC.dashboard_link(args.queue, job_id))


async def _dead(op: Operator, args: argparse.Namespace, out: Any) -> int:
    dead = await op.dead(args.queue, args.limit or None)
    return _emit(out, args, {"dead": dead}, R.dead_text(dead, op.now()))


async def _leases(op: Operator, args: argparse.Namespace, out: Any) -> int:
    leases = (await op.call(args.queue, "leases"))["leases"]
    return _emit(out, args, {"leases": leases}, R.leases_text(leases, op.now()))


async def _series(op: Operator, args: argparse.Namespace, out: Any) -> int:
    if args.limit < 0 or (args.since is not None and not args.since > 0):
        raise UsageError("--limit must be >= 0 and --since > 0")
    since = None if args.since is None else op.now() - args.since
    rows = await op.series(args.queue, since, args.resolution)
    data = {"queue": args.queue, "resolution": args.resolution, "rows": rows}
    shown = rows[-args.limit:] if args.limit else rows
    return _emit(out, args, data, R.series_text(shown, len(rows), op.now()))


async def _follow(op: Operator, args: argparse.Namespace, out: Any) -> int:
    if args.count < 0 or args.seconds < 0:
        raise UsageError("--count and --seconds must be >= 0")
    seen = 0

    async def pump() -> None:
        nonlocal seen
        async for item in op.follower(args.queue).items():
            marker = item.get("kind") in MARKERS
            out.write((json.dumps(R.jsonable(item)) if args.json else
                       R.marker_line(item) if marker else R.event_line(item)) + "\n")
            out.flush()
            seen += not marker
            if args.count and seen >= args.count:
                return

    try:
        await within(pump(), args.seconds or None)
    except asyncio.TimeoutError:
        pass
    return EXIT_OK


async def _resubmit(op: Operator, args: argparse.Namespace, out: Any) -> int:
    job_id = await resolve_id(op, args.queue, args.job_id)
    reply = await op.call(args.queue, "requeue", job_id=job_id)  # the op's wire name
    new_id = reply.get("job_id")
    if new_id is None:
        raise UnknownJob(f"queue {args.queue!r} holds no dead job {job_id!r}")
    status = str(reply.get("status") or "requeued")  # the wire's status words, in --json too
    text = (f"{job_id} was already resubmitted as {new_id}" if status == "already_requeued"
            else f"resubmitted {job_id} as {new_id}")
    return _emit(out, args, {"job_id": new_id, "dead_job_id": job_id, "status": status}, text)


async def _purge(op: Operator, args: argparse.Namespace, out: Any) -> int:
    if args.older_than is not None and not args.job_ids and not args.all:
        return await OC.purge_older(op, args, out, _emit, UsageError)
    if bool(args.job_ids) == bool(args.all) or args.older_than is not None:
        raise UsageError("purge-dead: give JOB_ID..., --all or --older-than AGE (one of them)")
    fields: dict[str, Any] = {} if args.all else {"job_ids": list(args.job_ids)}
    purged = int((await op.call(args.queue, "purge_dead", **fields))["purged"])
    return _emit(out, args, {"purged": purged}, f"purged {purged} dead letter(s)")


async def _pause_resume(op: Operator, args: argparse.Namespace, out: Any) -> int:
    return await pause_cmd.pause_resume(op, args, out, _emit)


async def _cancel(op: Operator, args: argparse.Namespace, out: Any) -> int:
    job_id = await resolve_id(op, args.queue, args.job_id)
    status = str((await op.call(args.queue, "cancel", job_id=job_id))["status"])
    if status == "unknown":
        raise UnknownJob(f"queue {args.queue!r} holds no job {job_id!r}")
    words = {"cancelled": "cancelled", "cancelling": "cancelling: its worker is told to stop it",
             "too_late": "too late: it already finished"}
    return _emit(out, args, {"job_id": job_id, "status": status},
                 f"{job_id}: {words.get(status, status)}")


_HANDLERS = {"stats": _stats, "jobs": _jobs, "why": _why, "dead": _dead, "leases": _leases,
             "series": _series, "follow": _follow, "resubmit": _resubmit,
             "purge-dead": _purge,
             "pause": _pause_resume, "resume": _pause_resume, "cancel": _cancel,
             "update": lambda op, a, out: update_cmd.update(op, a, out, _emit, resolve_id,
                                                            UnknownJob),
             "workers": lambda op, a, out: OC.workers(op, a, out, _emit),
             "redrive-dead": lambda op, a, out: OC.redrive_dead(op, a, out, _emit, UsageError),
             "promote": lambda op, a, out: OC.promote(op, a, out, _emit),
             "queues": lambda op, a, out: OC.queues(op, a, out, _emit), "record": run_record,
             "batches": lambda op, a, out: BC.batches(op, a, out, _emit),
             "batch": lambda op, a, out: BC.batch(op, a, out, _emit)}


def main(argv: Sequence[str] | None = None) -> int:
    """The console script: parse, run, map errors to exit codes and one stderr line (and,
    with ``--json``, a JSON object ``{"error": TYPE, "message": ...}`` on stdout)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    try:
        args = parser().parse_args(argv)
        return asyncio.run(run(args, sys.stdout))
    except KeyboardInterrupt:
        return EXIT_OK
    except OwnerUnavailable as exc:
        return _fail(EXIT_NO_OWNER, exc, as_json)
    except (UsageError, ConfigError) as exc:
        return _fail(EXIT_USAGE, exc, as_json)
    except (AdminDisabled, LookupError, IstosError) as exc:
        return _fail(EXIT_REFUSED, exc, as_json)


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def error_object(exc: BaseException) -> dict[str, str]:
    """What ``--json`` prints for an error: its type (``LookupError`` for an unknown job)."""
    return {"error": type(exc).__name__, "message": one_line(exc)}


def _fail(code: int, exc: BaseException, as_json: bool = False) -> int:
    if as_json:
        sys.stdout.write(json.dumps(error_object(exc)) + "\n")
        sys.stdout.flush()
    sys.stderr.write(f"istos: {one_line(exc)}\n")
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
