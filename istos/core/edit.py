"""PURE: editing a waiting job (``app.update``): its data, its start time, its priority.

Only a job that has not started may change: ``ready`` or ``delayed``. A leased, done, dead or
cancelled job is ``too_late`` (a change of its fate, such as cancel, is an admin op); an id the
queue does not hold is ``unknown``, or ``too_late`` while a dedup mark says it finished.

All or nothing: the whole edit is one change of one record, written by one durable write
before the owner answers (write, then apply: a failed write puts the record back as it was),
so no reader ever sees half of it. The record counts its edits (``edits``, ``edited_at``, shown
by ``why``) and an ``updated`` event says what changed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from .records import DELAYED, READY, JobRecord

if TYPE_CHECKING:
    from .state import QueueState

UPDATED: Final = "updated"
TOO_LATE: Final = "too_late"
UNKNOWN: Final = "unknown"


def update_job(state: QueueState, job_id: str, now: float, *, body: bytes | None = None,
               ready_at: float | None = None, priority: int | None = None) -> str:
    """Edit waiting job ``job_id``: a new ``body``, a new start time ``ready_at`` (at or
    before ``now``: ready at once, queued behind the jobs ready already; later: delayed until
    then) and/or a new ``priority``. Returns ``updated``, ``too_late`` or ``unknown``."""
    rec = state.jobs.get(job_id)
    if rec is None:
        return TOO_LATE if state.marks and state.marks.holds(job_id, now) else UNKNOWN
    if rec.state != READY and rec.state != DELAYED:
        return TOO_LATE
    detail: dict[str, Any] = {}
    if body is not None:
        detail["data_bytes"] = len(body)
    if priority is not None and priority != rec.priority:
        detail["priority"] = priority
    else:
        priority = None
    start = None if ready_at is None else max(ready_at, now)
    if start is not None:
        detail["ready_at"] = start
    # One change of the record; a failed write puts it back (write, then apply).
    state.edit_waiting(rec, now, body=body, start=start, priority=priority, detail=detail)
    return UPDATED


def lifecycle_fields(rec: JobRecord) -> dict[str, Any]:
    """What ``why`` shows of a job's life under the producer's control, only what is set:
    its unique key and scope, its debounce burst, and its edits."""
    out: dict[str, Any] = {}
    if rec.unique_key is not None:
        out["unique_key"], out["unique"] = rec.unique_key, rec.unique
    if rec.debounce_key is not None:
        out["debounce_key"], out["debounce_first_at"] = rec.debounce_key, rec.debounce_first_at
    if rec.edits:
        out["edits"], out["edited_at"] = rec.edits, rec.edited_at
    return out
