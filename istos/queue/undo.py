"""PURE: snapshots of job records, so a change whose write failed can be rolled back.

With undo tracking on (durable owners), the first change of a record since the last checkpoint
saves a :class:`Snapshot` of it (``QueueState.take_undo`` hands them to the write); if the write
fails, ``QueueState.rollback`` puts each record back as it was (write, then apply: memory never
runs ahead of storage).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .records import SCALAR_FIELDS, Attempt, JobRecord


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
                           last.outcome, last.error, last.backoff_s)
    return Snapshot(rec, tuple(getattr(rec, name) for name in SCALAR_FIELDS), hist)
