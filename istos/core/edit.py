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

from .. import events as ev
from .records import DELAYED, READY, JobRecord, JobState

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
    state._save(rec)  # a failed write puts the record back (write, then apply)
    detail: dict[str, Any] = {}
    if body is not None:
        rec.body = body
        detail["data_bytes"] = len(body)
    moved = False
    if priority is not None and priority != rec.priority:
        rec.priority = priority
        detail["priority"] = priority
        moved = True
    if ready_at is not None:
        rec.ready_at = max(ready_at, now)
        detail["ready_at"] = rec.ready_at
        moved = True
    if moved:  # a fresh heap entry (the old one is stale by its seq: lazy deletion)
        target: JobState = DELAYED if rec.ready_at > now else READY
        if rec.state != target:
            state._move(rec, target)
        if target == READY:
            state.heaps.push_ready(rec)
        else:
            state.heaps.push_delayed(rec)
    rec.edits = (rec.edits or 0) + 1
    rec.edited_at = now
    state.dirty.append(rec)
    state._emit(now, rec, ev.UPDATED, **detail)
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
