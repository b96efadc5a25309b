"""PURE: dedup windows, the ids a queue keeps reserved after their jobs finished.

``enqueue(..., job_id=ID, dedup_s=600)`` makes the job's id stay reserved for ``dedup_s`` seconds
after the job finished (done, dead or cancelled), so a producer that resends the same order id
after the job ran gets the first job's id back and nothing changes (BullMQ's deduplication
``ttl``, Temporal's workflow-id reuse policy). While the job itself is held the queue refuses
the id anyway; a mark takes over only when the record is forgotten (acked without results, a
result expired, a dead letter purged) before its window ends.

A mark is stored under the job's own key in the queue's job namespace, in place of the record
(:class:`DedupMark`, written by the same group commit that would have deleted the record), so
forgetting a job and reserving its id are one atomic write, fenced like every other, and an
owner restart or an HA failover reloads the marks with the jobs.

Memory: one entry per reserved id, until its window ends (at most the ids that finished within
``dedup_s``); the owner's sweep drops expired marks and deletes them from storage.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import msgpack

__all__ = ["DedupMark", "DedupMarks", "is_mark", "is_stored_mark", "mark_from_dict"]

MARK_KEY = "dedup_until"
"""The one key of a stored mark's map (a job record never has it)."""
KEY_KEY = "unique_key"
"""A mark's second key, when the forgotten job had a unique key (``unique.py``)."""


@dataclass(frozen=True, slots=True)
class DedupMark:
    """A reserved id, to write in place of its forgotten record: reserved until ``until``
    (the owner's clock)."""

    job_id: str
    until: float
    unique_key: str | None = None  # the job's unique key, held as long (unique.py)

    def to_dict(self) -> dict[str, Any]:
        if self.unique_key is not None:
            return {MARK_KEY: self.until, KEY_KEY: self.unique_key}
        return {MARK_KEY: self.until}


def is_mark(d: dict[str, Any]) -> bool:
    """Whether a decoded value of the job namespace is a mark rather than a job record."""
    return MARK_KEY in d


def is_stored_mark(raw: bytes) -> bool:
    """Whether a stored value of the job namespace (msgpack) is a mark, not a record."""
    d = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    return isinstance(d, dict) and is_mark(d)


def mark_from_dict(job_id: str, d: dict[str, Any]) -> DedupMark | None:
    """The mark stored under ``job_id``; None if its value is not a finite number."""
    until = d.get(MARK_KEY)
    if isinstance(until, bool) or not isinstance(until, (int, float)) or until != until \
            or until in (float("inf"), float("-inf")):
        return None
    key = d.get(KEY_KEY)
    return DedupMark(job_id, float(until), key if isinstance(key, str) and key else None)


class DedupMarks:
    """The reserved ids of one queue, each until its window ends."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}
        # (until, id); entries superseded by a later add() or drop() of the same id are skipped.
        self._heap: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._until)

    def holds(self, job_id: str, now: float) -> bool:
        """Whether ``job_id`` is reserved at ``now`` (a window ends at ``until``, exclusive)."""
        until = self._until.get(job_id)
        return until is not None and now < until

    def until(self, job_id: str) -> float | None:
        return self._until.get(job_id)

    def add(self, job_id: str, until: float) -> None:
        self._until[job_id] = until
        heapq.heappush(self._heap, (until, job_id))

    def drop(self, job_id: str) -> bool:
        """Forget ``job_id``'s mark (a new job took the id); True if it had one."""
        return self._until.pop(job_id, None) is not None

    def next_expiry(self) -> float | None:
        heap = self._heap
        while heap and self._until.get(heap[0][1]) != heap[0][0]:
            heapq.heappop(heap)  # superseded
        return heap[0][0] if heap else None

    def pop_expired(self, now: float) -> list[str]:
        """The ids whose window ended by ``now``, forgotten here (their stored marks are the
        caller's to delete)."""
        out: list[str] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            until, job_id = heapq.heappop(heap)
            if self._until.get(job_id) == until:
                del self._until[job_id]
                out.append(job_id)
        return out
