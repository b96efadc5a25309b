"""PURE: unique keys, at most one job per key holding it within the key's scope.

``enqueue(..., unique_key="feed:42", unique=SCOPE)`` gives a job a key that no other job of the
queue may hold at the same time. While a job holds its key, a new enqueue with that key adds
nothing and is answered with the holder's id. The holder's scope says how long it holds:

- ``queued``: while it waits for its first run (ready or delayed, never claimed); once a worker
  claimed it, a new job with the key may be queued (a retry does not take the key back);
- ``active``: until it is acked, dead-lettered or cancelled (the default);
- ``finished``: as ``active``, and for ``unique_s`` seconds after it ended.

Exact, not best effort: the owner serialises every enqueue of its queue, and a key whose first
job's write is still in flight makes the next enqueue with that key wait for that write (the
owner's side, ``owner/handlers/accept.py``). The key, scope and window are stored with the job's
record, so an owner restart or an HA failover rebuilds the index from the records it reloads; a
``finished`` key whose record is forgotten before its window ended (acked without results) is kept
by the dedup mark written in place of the record (``dedup.py``), which carries the key.

Cost: one dict lookup per enqueue with a key; none for a queue that never uses one. Memory: one
entry per key whose job is still held or whose window is open.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

from .records import DELAYED, LEASED, READY, JobRecord

__all__ = ["ACTIVE", "FINISHED", "QUEUED", "SCOPES", "Scope", "UniqueKeys", "UniqueSpec",
           "holds", "window_after"]

Scope = Literal["queued", "active", "finished"]
QUEUED: Final = "queued"
ACTIVE: Final = "active"
FINISHED: Final = "finished"
SCOPES: tuple[Scope, ...] = (QUEUED, ACTIVE, FINISHED)
MAX_KEY_BYTES = 200  # a key is kept with its record and in a dedup mark: as long as a job id


@dataclass(frozen=True, slots=True)
class UniqueSpec:
    """A new job's unique key, checked already: ``unique_s`` only with the ``finished`` scope
    (None there means 0: held until the job ended)."""

    key: str
    scope: Scope = ACTIVE
    unique_s: float | None = None

    def apply(self, rec: JobRecord) -> JobRecord:
        """Give a new record (``QueueState.new_record``) this key, scope and window."""
        rec.unique_key, rec.unique, rec.unique_s = self.key, self.scope, self.unique_s
        return rec

    def to_wire(self) -> dict[str, object]:
        """The ``unique`` field of an ``enqueue`` request (or item) carrying this key."""
        d: dict[str, object] = {"key": self.key, "scope": self.scope}
        if self.unique_s:
            d["s"] = self.unique_s
        return d


def holds(rec: JobRecord, now: float) -> bool:
    """Whether ``rec`` (a job with a unique key) holds its key at ``now``, by its own scope."""
    state, scope = rec.state, rec.unique
    if state == READY or state == DELAYED:
        return scope != QUEUED or not rec.history
    if state == LEASED:
        return scope != QUEUED
    if scope != FINISHED:  # ended: done, dead, cancelled, or any other end state
        return False
    end = rec.finished_at
    return end is not None and now < end + (rec.unique_s or 0.0)


def window_after(rec: JobRecord) -> float:
    """How long after ``rec`` ended its id (and key) stay reserved once its record is
    forgotten: the longer of its ``dedup_s`` and, for a ``finished`` key, its ``unique_s``."""
    window = rec.dedup_s or 0.0
    if rec.unique_key is not None and rec.unique == FINISHED and rec.unique_s:
        window = max(window, rec.unique_s)
    return window


class UniqueKeys:
    """The unique keys of one queue: for each, the job that last took it (its record held by
    the queue) or the mark of a forgotten one (its job id and the end of its window)."""

    def __init__(self) -> None:
        self._by_key: dict[str, str] = {}  # key -> id of the latest job with it
        self._marks: dict[str, tuple[str, float]] = {}  # key -> (job id, window end)
        self._mark_key: dict[str, str] = {}  # job id of a mark -> its key
        self._inflight: dict[str, str] = {}  # key -> id of a new job whose write is pending

    def __bool__(self) -> bool:
        return bool(self._by_key or self._marks or self._inflight)

    def __len__(self) -> int:
        return len(self._by_key) + len(self._marks)

    def holder(self, key: str, jobs: dict[str, JobRecord], now: float) -> str | None:
        """The id of the job holding ``key`` at ``now`` (a record, or a mark whose window is
        open), or None when a new job may take it."""
        jid = self._by_key.get(key)
        if jid is not None:
            rec = jobs.get(jid)
            if rec is not None and rec.unique_key == key and holds(rec, now):
                return jid
        mark = self._marks.get(key)
        if mark is not None and now < mark[1]:
            return mark[0]
        return None

    def scope_of(self, jid: str, jobs: dict[str, JobRecord]) -> str:
        """The scope by which job ``jid`` holds its key (a mark: ``finished``)."""
        rec = jobs.get(jid)
        return (rec.unique or ACTIVE) if rec is not None else FINISHED

    def note(self, rec: JobRecord) -> None:
        """``rec`` (with a key) entered the queue: it is the key's latest job, unless a job
        with the key enqueued later is noted already (records reload in any order)."""
        key = rec.unique_key
        assert key is not None
        self._inflight.pop(key, None)
        self._by_key[key] = rec.job_id
        mark = self._marks.get(key)
        if mark is not None and mark[0] != rec.job_id:
            # Only an ended window gives way to a new job (holder() said so), or a reload:
            # the mark of an older job never shadows the record of a newer one.
            del self._marks[key]
            self._mark_key.pop(mark[0], None)

    def note_restored(self, rec: JobRecord, jobs: dict[str, JobRecord]) -> None:
        """As :meth:`note`, for a record reloaded from storage: the job enqueued last wins."""
        key = rec.unique_key
        assert key is not None
        other = jobs.get(self._by_key.get(key, ""))
        if other is None or other.job_id == rec.job_id or other.enqueued_at <= rec.enqueued_at:
            self._by_key[key] = rec.job_id

    def forget(self, rec: JobRecord) -> None:
        """``rec``'s record leaves the queue without a mark."""
        key = rec.unique_key
        if key is not None and self._by_key.get(key) == rec.job_id:
            del self._by_key[key]

    def mark(self, key: str, jid: str, until: float) -> None:
        """Job ``jid``'s record is forgotten, its key held until ``until`` (a dedup mark)."""
        if self._by_key.get(key) == jid:
            del self._by_key[key]
        old = self._marks.get(key)
        if old is not None and old[1] > until:
            return
        if old is not None:
            self._mark_key.pop(old[0], None)
        self._marks[key] = (jid, until)
        self._mark_key[jid] = key

    def drop_mark(self, jid: str) -> None:
        """The mark stored under ``jid`` ended (the sweep deleted it) or a new job took the id."""
        key = self._mark_key.pop(jid, None)
        if key is not None and self._marks.get(key, ("",))[0] == jid:
            del self._marks[key]

    # -- keys of new jobs whose write is in flight (the owner's enqueue path) ----------------
    def inflight(self, key: str) -> str | None:
        """The id of a new job with ``key`` whose write is pending, if any."""
        return self._inflight.get(key)

    def reserve(self, key: str, jid: str) -> None:
        self._inflight[key] = jid

    def release(self, key: str, jid: str) -> None:
        if self._inflight.get(key) == jid:
            del self._inflight[key]


def check_window(field: str, value: object) -> float:
    """A window in seconds (``unique_s``, ``debounce_s``...): a finite number >= 0, as float;
    ValueError naming ``field`` otherwise (the callers retype it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"{field} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)
