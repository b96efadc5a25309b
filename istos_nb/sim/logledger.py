"""The job-log ledger of a simulation: what each handler attempt wrote with ``ctx.log``, and
what the owners kept of it at the end.

The checker's job-log invariant (``checker_logs.py``) compares the two, so both are gathered
here without the engine's help on the writing side: the ledger records every line as the
handler passed it (``str()``-ed, before the worker's cut), in the handler's own call, and
consumes no randomness (a run that logs keeps the same event stream as one that does not).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from istos import Istos
from istos.context import JobContext
from istos.core.dedup import is_stored_mark
from istos.core.records import JobRecord, decode_record

_CONTEXT_FIELDS = tuple(f.name for f in dataclasses.fields(JobContext))


@dataclasses.dataclass(frozen=True, slots=True)
class LedgerContext(JobContext):
    """The ``ctx`` a simulated handler receives: a real :class:`JobContext` (same signals, so
    the engine sends what it always sends) whose ``log`` also notes the line in the ledger.
    A subclass, not a wrapper: handlers may annotate or test ``ctx`` as a ``JobContext``."""

    _ledger: list[dict[str, Any]] = dataclasses.field(default_factory=list, repr=False,
                                                      compare=False)
    _row: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def log(self, message: object) -> None:
        lines = self._row["lines"]
        if not lines:  # the row joins the ledger at its first line: runs that log nothing
            self._ledger.append(self._row)  # cost one dict, never a row
        lines.append(message if isinstance(message, str) else str(message))
        JobContext.log(self, message)


def ledger_context(ctx: JobContext, ledger: list[dict[str, Any]], node: str,
                   t: float) -> LedgerContext:
    """``ctx`` as a :class:`LedgerContext` writing to ``ledger`` (one row per attempt that
    logged: job_id, queue, attempt, node, t the run's start, lines)."""
    row = {"job_id": ctx.job_id, "queue": ctx.queue, "attempt": ctx.attempt, "node": node,
           "t": t, "lines": []}
    values = {name: getattr(ctx, name) for name in _CONTEXT_FIELDS}
    return LedgerContext(**values, _ledger=ledger, _row=row)


def kept_logs(serving: Iterable[Istos], stored: Mapping[str, Mapping[str, bytes]]
              ) -> list[dict[str, Any]]:
    """Every attempt the owners kept at the end with its log: from the serving apps' owners
    (``Istos.held_records``, as ``held``), then from ``stored`` (queue -> that queue's stored
    records, on durable storage) for the records no serving owner holds (dead letters, done
    jobs of a stopped leader). One row per history entry that has a log: queue, job_id,
    attempt, outcome, logs, logs_dropped."""
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for app in serving:
        for rec in app.held_records():
            if (rec.queue, rec.job_id) not in seen:
                seen.add((rec.queue, rec.job_id))
                rows += _attempt_rows(rec)
    for q in sorted(stored):
        for job_id, raw in stored[q].items():
            if (q, job_id) not in seen and not is_stored_mark(raw):
                rows += _attempt_rows(decode_record(raw))
    return rows


def _attempt_rows(rec: JobRecord) -> list[dict[str, Any]]:
    return [{"queue": rec.queue, "job_id": rec.job_id, "attempt": a.attempt,
             "outcome": a.outcome, "logs": list(a.logs), "logs_dropped": a.logs_dropped or 0}
            for a in rec.history if a.logs is not None]
