"""PURE: debounce, one run per burst of enqueues with one key.

``enqueue(..., debounce_key="reindex:7", debounce_s=2.0, debounce_max_s=30.0)``: the first call
of a burst adds a job that starts ``debounce_s`` later. Each further call with the key while
that job has not started (ready or delayed, never claimed) adds nothing: it replaces the
job's data (``debounce="last"``, the default) or keeps the first (``"first"``), and moves its
start to ``debounce_s`` after this call, but never later than ``debounce_max_s`` after the
burst's first call. Once a worker claimed the job, the next call starts a new burst.

Exact: the owner serialises every enqueue of its queue, a burst's first job is reserved while
its write is in flight (the next call with the key waits for it), and each later call is one
durable write of the job's record. The key, the burst's first call and its cap are stored
with the record, so a restarted owner or a new HA leader rebuilds the index from the records
it reloads. Cost: one dict lookup per enqueue with a key; none for a queue not using it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

from .records import DELAYED, READY, JobRecord


class BurstState(Protocol):
    """What :func:`rebounce` changes of the queue state (``state.QueueState``; a protocol, so
    this module does not import the state that imports it): only its public edit."""

    def edit_waiting(self, rec: JobRecord, now: float, *, body: bytes | None = None,
                     start: float | None = None, priority: int | None = None,
                     detail: dict[str, Any] | None = None) -> None: ...


__all__ = ["DEBOUNCE_MODES", "DebounceKeys", "DebounceSpec", "Mode", "is_open", "rebounce"]

Mode = Literal["last", "first"]
LAST: Final = "last"
FIRST: Final = "first"
DEBOUNCE_MODES: tuple[Mode, ...] = (LAST, FIRST)


@dataclass(frozen=True, slots=True)
class DebounceSpec:
    """A call's debounce options, checked already (``max_s`` None: no cap)."""

    key: str
    debounce_s: float
    max_s: float | None = None
    mode: Mode = LAST

    def apply(self, rec: JobRecord, now: float) -> JobRecord:
        """Make a new record (built with ``delay_s=debounce_s``) a burst's first job."""
        rec.debounce_key, rec.debounce_first_at, rec.debounce_max_s = self.key, now, self.max_s
        return rec

    def to_wire(self) -> dict[str, object]:
        """The ``debounce`` field of an ``enqueue`` request."""
        d: dict[str, object] = {"key": self.key, "s": self.debounce_s}
        if self.max_s is not None:
            d["max_s"] = self.max_s
        if self.mode != LAST:
            d["mode"] = self.mode
        return d


def is_open(rec: JobRecord) -> bool:
    """Whether ``rec``'s burst still takes calls: it has not started."""
    return (rec.state == READY or rec.state == DELAYED) and not rec.history


def start_of(rec: JobRecord, spec: DebounceSpec, now: float) -> float:
    """When the burst's job starts after a call at ``now``: ``debounce_s`` later, capped at
    ``debounce_max_s`` after the burst's first call (never before ``now``)."""
    start = now + spec.debounce_s
    cap = rec.debounce_max_s
    first = rec.debounce_first_at
    if cap is not None and first is not None:
        start = min(start, first + cap)
    return max(start, now)


def rebounce(state: BurstState, rec: JobRecord, body: bytes, spec: DebounceSpec,
             now: float) -> None:
    """A further call of ``rec``'s burst: new data (mode ``last``) and a later start, as one
    change of the record (its write is the caller's: write, then apply)."""
    replace, start = spec.mode == LAST, start_of(rec, spec, now)
    state.edit_waiting(rec, now, body=body if replace else None, start=start,
                       detail={"debounced": spec.key, "ready_at": start,
                               "data_replaced": replace})


class DebounceKeys:
    """The debounce keys of one queue: for each, the job of its latest burst."""

    def __init__(self) -> None:
        self._by_key: dict[str, str] = {}
        self._inflight: dict[str, str] = {}  # key -> id of a burst's first job being written

    def __len__(self) -> int:
        return len(self._by_key)

    def open_job(self, key: str, jobs: dict[str, JobRecord]) -> JobRecord | None:
        """The job of ``key``'s burst if that burst still takes calls."""
        jid = self._by_key.get(key)
        if jid is None:
            return None
        rec = jobs.get(jid)
        if rec is None or rec.debounce_key != key:
            del self._by_key[key]  # gone: forgotten lazily here
            return None
        return rec if is_open(rec) else None

    def note(self, rec: JobRecord, jobs: dict[str, JobRecord]) -> None:
        """``rec`` (with a key) entered the queue, or was reloaded: the burst enqueued last
        wins."""
        key = rec.debounce_key
        assert key is not None
        self._inflight.pop(key, None)
        other = jobs.get(self._by_key.get(key, ""))
        if other is None or other.job_id == rec.job_id or other.enqueued_at <= rec.enqueued_at:
            self._by_key[key] = rec.job_id

    def forget(self, rec: JobRecord) -> None:
        """``rec``'s record leaves the queue."""
        key = rec.debounce_key
        if key is not None and self._by_key.get(key) == rec.job_id:
            del self._by_key[key]

    def inflight(self, key: str) -> str | None:
        return self._inflight.get(key)

    def reserve(self, key: str, jid: str) -> None:
        self._inflight[key] = jid

    def release(self, key: str, jid: str) -> None:
        if self._inflight.get(key) == jid:
            del self._inflight[key]
