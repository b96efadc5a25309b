"""PURE: snapshots of job records, so a change whose write failed can be rolled back.

With undo tracking on (durable owners), the first change of a record since the last checkpoint
saves a :class:`Snapshot` of it (``QueueState.take_undo`` hands them to the write); if the write
fails, ``QueueState.rollback`` puts each record back as it was (write, then apply: memory never
runs ahead of storage).
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Protocol

from ..events import JobEvent
from .debounce import DebounceKeys
from .dedup import DedupMark, DedupMarks
from .heaps import JobHeaps
from .records import DEAD, SCALAR_FIELDS, Attempt, JobRecord, JobState
from .unique import UniqueKeys

# The record's scalar fields as one tuple, read in C (one call instead of a getattr each).
_scalars = attrgetter(*SCALAR_FIELDS)


class Restorable(Protocol):
    """The parts of a :class:`~istos.core.state.QueueState` a rollback puts back."""

    jobs: dict[str, JobRecord]
    dead: dict[str, JobRecord]
    counts: dict[JobState, int]
    dirty: list[JobRecord | str | DedupMark]
    events: list[JobEvent]
    heaps: JobHeaps
    marks: DedupMarks
    unique: UniqueKeys
    debounce: DebounceKeys


@dataclass(slots=True)
class Snapshot:
    """A record as it was before its first change since the last checkpoint (None: absent)."""

    rec: JobRecord
    fields: tuple[Any, ...] | None
    history: list[Attempt]

    def restore(self) -> JobRecord | None:
        """Put the saved fields back into the record; None if it did not exist before."""
        if self.fields is None:
            return None
        rec = self.rec
        for name, value in zip(SCALAR_FIELDS, self.fields):
            setattr(rec, name, value)
        rec.history = self.history
        return rec


def snapshot(rec: JobRecord) -> Snapshot:
    hist = list(rec.history)
    if hist:  # only the last attempt is ever changed in place (_finish_attempt)
        last = hist[-1]
        hist[-1] = Attempt(last.attempt, last.worker, last.claimed_at, last.finished_at,
                           last.outcome, last.error, last.backoff_s, last.traceback,
                           None if last.logs is None else list(last.logs), last.logs_dropped)
    return Snapshot(rec, _scalars(rec), hist)


def put_back(state: Restorable, undo: dict[str, Snapshot]) -> None:
    """Put every record in ``undo`` back into ``state`` as it was, and drop the changes and
    events not yet drained, which were made on top of them (``QueueState.rollback``)."""
    state.dirty, state.events = [], []
    for job_id, snap in undo.items():
        cur = state.jobs.pop(job_id, None)
        if cur is not None:
            state.counts[cur.state] -= 1
            state.dead.pop(job_id, None)
            if state.heaps.order is not None:  # (reinsert below adds it back if ready)
                state.heaps.order.discard(job_id)
        rec = snap.restore()
        if rec is None:
            continue
        state.marks.drop(job_id)  # a mark written in its place failed with it
        state.jobs[rec.job_id] = rec
        if rec.unique_key is not None:  # its key's entry (or mark) goes back with it
            state.unique.drop_mark(job_id)
            state.unique.note_restored(rec, state.jobs)
        if rec.debounce_key is not None:
            state.debounce.note(rec, state.jobs)
        state.counts[rec.state] += 1
        state.heaps.reinsert(rec, 0.0)
        if rec.state == DEAD:
            state.dead[rec.job_id] = rec
