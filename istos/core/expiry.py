"""PURE: start deadlines. ``enqueue(..., expires_s=...)`` or ``start_by=``: a job that no worker
has started by then ends ``expired``, never run and never dead-lettered (Celery's ``expires``,
Sidekiq's expiring jobs).

A job counts as started once a worker was handed it and did not hand it back unrun: every
attempt in its history ended ``released`` (a prefetched job whose worker gave it back before
starting it, or a shutdown's hand-back) means it never started. Only a job that never started
expires; a job that ran once and waits for a retry runs that retry whatever the time.

The deadline heap is one more lazy heap of :class:`~.heaps.JobHeaps` (``(start_by, job_id)``):
an entry is live while its job waits (ready or delayed), never started, with that ``start_by``.
Pushes and pops are O(log n); a job with no deadline costs nothing. Time is passed in.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigError
from ..protocol import MAX_DELAY_S, MAX_TIME
from .records import DELAYED, READY, RELEASED, JobRecord

__all__ = ["EXPIRED_ERROR", "StartDeadlines", "claim_start_by", "never_started",
           "start_by_of", "start_deadline", "waits_to_start"]

EXPIRED_ERROR = "no worker started it before its start deadline"
"""The ``error`` a ``result()`` of an expired job reports."""


def never_started(rec: JobRecord, *, leased_now: bool = False) -> bool:
    """Whether no worker ever started ``rec``: each attempt was handed back unrun. With
    ``leased_now`` the latest attempt (the lease being handed out) is not looked at."""
    history = rec.history[:-1] if leased_now else rec.history
    return all(a.outcome == RELEASED for a in history)


def waits_to_start(rec: JobRecord) -> bool:
    """``rec`` has a start deadline, waits (ready or delayed) and never started."""
    return rec.start_by is not None and rec.state in (READY, DELAYED) and never_started(rec)


def claim_start_by(rec: JobRecord) -> float | None:
    """The start deadline a claim reply carries for leased ``rec`` (None: none applies, as
    when it started before): the worker hands the job back unrun if it is past when it would
    start it (a prefetched job)."""
    if rec.start_by is None or not never_started(rec, leased_now=True):
        return None
    return rec.start_by


def start_deadline(value: object) -> float | None:
    """A claim reply's ``start_by`` as a worker trusts it: a finite number, else None (a
    malformed value from the wire means no deadline, never a crash)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def start_by_of(msg: dict[str, Any], now: float) -> float | None:
    """The absolute start deadline an ``enqueue`` request (or ``enqueue_many`` item) asks
    for: ``start_by`` (epoch seconds) as is, or ``now + expires_s``; None for neither. The
    schema checked each field; both at once is refused there."""
    start_by = msg.get("start_by")
    if start_by is not None:
        return float(start_by)
    expires_s = msg.get("expires_s")
    return None if expires_s is None else now + float(expires_s)


def check_deadline(expires_s: object, start_by: object, delay_s: float,
                   now: float) -> tuple[float | None, float | None]:
    """A producer's ``expires_s`` / ``start_by`` (a timezone-aware ``datetime`` or epoch
    seconds), checked before anything is sent: ``(expires_s, start_by)`` as the wire carries
    them (``start_by`` as epoch seconds). ``now``: the producer's wall clock.

    Raises :class:`ConfigError` naming the field: both given, a non-number or non-finite
    ``expires_s``, one that is not positive or not after ``delay_s`` (the job would expire
    before it is due), a naive ``datetime``, a ``start_by`` that is neither a datetime nor a
    number, or one not after ``now + delay_s``.
    """
    if expires_s is None and start_by is None:
        return None, None
    if expires_s is not None and start_by is not None:
        raise ConfigError("expires_s and start_by: give one start deadline, not both")
    if expires_s is not None:
        if isinstance(expires_s, bool) or not isinstance(expires_s, (int, float)) \
                or not math.isfinite(expires_s):
            raise ConfigError(f"expires_s must be a finite number of seconds, got {expires_s!r}")
        if not 0 < expires_s <= MAX_DELAY_S:
            raise ConfigError(f"expires_s must be > 0 and at most {MAX_DELAY_S:g}, got "
                              f"{expires_s!r}")
        if expires_s <= delay_s:
            raise ConfigError(f"expires_s ({expires_s:g}) must be later than delay_s "
                              f"({delay_s:g}): the job would expire before it is due")
        return float(expires_s), None
    at = _epoch(start_by)
    if at <= now + delay_s:
        raise ConfigError(f"start_by ({at:.3f}) must be later than now plus delay_s "
                          f"({now + delay_s:.3f}): the job would expire before it is due")
    return None, at


def _epoch(start_by: object) -> float:
    import datetime as dt

    if isinstance(start_by, dt.datetime):
        if start_by.tzinfo is None or start_by.utcoffset() is None:
            raise ConfigError("start_by must be a timezone-aware datetime (a naive one names "
                              "no instant), e.g. datetime.now(timezone.utc) + timedelta(...)")
        at = start_by.timestamp()
    elif isinstance(start_by, (int, float)) and not isinstance(start_by, bool):
        at = float(start_by)
    else:
        raise ConfigError(f"start_by must be a timezone-aware datetime or epoch seconds, got "
                          f"{type(start_by).__name__}")
    if not math.isfinite(at) or not 0 < at <= MAX_TIME:
        raise ConfigError(f"start_by must be a finite time between 1970 and year 5138, got "
                          f"{start_by!r}")
    return at


class StartDeadlines:
    """The lazy heap of start deadlines (see the module doc)."""

    __slots__ = ("heap",)

    def __init__(self) -> None:
        self.heap: list[tuple[float, str]] = []

    def __bool__(self) -> bool:
        return bool(self.heap)

    def push(self, rec: JobRecord) -> None:
        """Watch ``rec``'s deadline (call when it starts waiting: enqueued, restored, handed
        back, rolled back); a job without one is not pushed."""
        if rec.start_by is not None:
            heapq.heappush(self.heap, (rec.start_by, rec.job_id))

    @staticmethod
    def live(jobs: dict[str, JobRecord], at: float, job_id: str) -> JobRecord | None:
        rec = jobs.get(job_id)
        return rec if rec is not None and rec.start_by == at and waits_to_start(rec) else None

    def pop_due(self, jobs: dict[str, JobRecord], now: float) -> Iterator[JobRecord]:
        """Each waiting, never-started record whose deadline is at or before ``now``."""
        heap = self.heap
        while heap and heap[0][0] <= now:
            at, job_id = heapq.heappop(heap)
            rec = self.live(jobs, at, job_id)
            if rec is not None:
                yield rec

    def hint(self) -> float:
        """The head's time in O(1) (maybe stale): a lower bound of :meth:`next_at`."""
        return self.heap[0][0] if self.heap else math.inf

    def next_at(self, jobs: dict[str, JobRecord]) -> float | None:
        """The earliest live deadline (stale heads dropped first)."""
        heap = self.heap
        while heap and self.live(jobs, heap[0][0], heap[0][1]) is None:
            heapq.heappop(heap)
        return heap[0][0] if heap else None
