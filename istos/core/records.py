"""PURE: the records of one queue's jobs (what the owner writes through to storage).

States: ``ready`` (claimable), ``delayed`` (claimable from ``ready_at``), ``leased`` (a worker
holds it until ``lease_deadline``), ``done`` (kept only with results, until ``expires_at``),
``dead``, ``cancelled`` (by ``app.cancel``; kept like a done job until ``expires_at``) and
``expired`` (its start deadline ``start_by`` passed before any worker started it: never run,
kept like a done job until ``expires_at``; ``expiry.py``) and ``waiting`` (enqueued with
``after=``: stored, not claimable until its parents ended as its ``on_parent_failure`` needs,
then ``ready`` or ``delayed``; ``deps.py``).
The transitions between them live in ``state.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

import msgpack

from .backoff import BackoffPolicy

JobState = Literal["ready", "delayed", "leased", "done", "dead", "cancelled", "expired",
                   "waiting"]
"""The state of a job (``JobRecord.state``, the keys of ``QueueState.counts``)."""

READY: Final = "ready"
DELAYED: Final = "delayed"
LEASED: Final = "leased"
DONE: Final = "done"
DEAD: Final = "dead"
CANCELLED: Final = "cancelled"
EXPIRED: Final = "expired"
WAITING: Final = "waiting"
STATES: tuple[JobState, ...] = (READY, DELAYED, LEASED, DONE, DEAD, CANCELLED, EXPIRED,
                                WAITING)
LEASE_EXPIRED_ERROR = "lease expired"
SPARED_ERROR = "lease expired during a storage outage (attempt not counted)"
RELEASED = "released"


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    lease_s: float = 30.0
    max_attempts: int = 5
    backoff: BackoffPolicy = BackoffPolicy()
    keep_results: bool = False
    result_ttl_s: float = 3600.0
    history_limit: int = 20
    tracebacks_kept: int = 2  # the newest failed attempts that keep their traceback
    rate_limit: tuple[int, float] | None = None  # (n, per_s): see ratelimit.py
    group_concurrency: int | None = None  # leased jobs per group at once (groups.py)
    group_rate_limit: tuple[int, float] | None = None  # (n, per_s) per group


@dataclass(slots=True)
class Attempt:
    """One delivery of a job: who held it, when, and how it ended."""

    attempt: int
    worker: str
    claimed_at: float
    finished_at: float | None = None
    outcome: str | None = None  # "acked" | "nacked" | "lease_expired"
    error: str | None = None
    backoff_s: float | None = None  # the wait chosen before the next try
    traceback: str | None = None  # the worker's formatted traceback of a failed attempt
    logs: list[str] | None = None  # ctx.log() lines of this attempt (joblogs.py)
    logs_dropped: int | None = None  # lines beyond the per-attempt limit, counted

    def to_dict(self) -> dict[str, Any]:
        d = {
            "attempt": self.attempt, "worker": self.worker, "claimed_at": self.claimed_at,
            "finished_at": self.finished_at, "outcome": self.outcome, "error": self.error,
            "backoff_s": self.backoff_s, "traceback": self.traceback,
        }
        if self.logs is not None:  # (only when written: the common entry stays as it was)
            d["logs"] = self.logs
            d["logs_dropped"] = self.logs_dropped or 0
        return d


@dataclass(slots=True)
class JobRecord:
    job_id: str
    queue: str
    body: bytes
    priority: int
    enqueued_at: float
    state: JobState = READY
    ready_at: float = 0.0
    seq: int = 0
    attempts: int = 0
    lease_token: str | None = None
    lease_worker: str | None = None
    lease_deadline: float | None = None
    last_error: str | None = None
    result: bytes | None = None
    finished_at: float | None = None
    expires_at: float | None = None
    # A tuple until the first attempt: an empty list per waiting job would double the objects
    # the cyclic garbage collector walks (its full pass over 100k held jobs stalls the loop).
    history: list[Attempt] | tuple[()] = ()
    meta: dict[str, Any] | None = None
    cancel_requested: bool | None = None  # app.cancel reached it while leased (persisted)
    dedup_s: float | None = None  # its id stays reserved this long after it finished (dedup.py)
    group: str | None = None  # its fairness/concurrency group (groups.py)
    start_by: float | None = None  # expires unless a worker started it by then (expiry.py)
    unique_key: str | None = None  # at most one job holds it within its scope (unique.py)
    unique: str | None = None  # that scope: "queued", "active" or "finished"
    unique_s: float | None = None  # a "finished" key stays held this long after the job ended
    edits: int | None = None  # how often app.update edited it while it waited (edit.py)
    edited_at: float | None = None  # when last
    debounce_key: str | None = None  # its burst's key (debounce.py)
    debounce_first_at: float | None = None  # the burst's first call
    debounce_max_s: float | None = None  # its start is never later than this after that call
    # The holder's latest ctx.progress() (not persisted: the next heartbeat brings it back).
    progress: float | None = None
    progress_note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {name: getattr(self, name) for name in BASE_FIELDS}
        if self.unique_key is not None or self.debounce_key is not None or self.edits:
            # (only when set: a job using none of them is stored as it always was)
            for name in LIFE_FIELDS:
                d[name] = getattr(self, name)
        d["history"] = [a.to_dict() for a in self.history] if self.history else []
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobRecord:
        fields: dict[str, Any] = {name: d.get(name) for name in BASE_FIELDS}
        if "unique_key" in d or "debounce_key" in d or "edits" in d:
            fields.update((name, d.get(name)) for name in LIFE_FIELDS)
        rec = cls(**fields)
        rec.history = [Attempt(**a) for a in d.get("history") or []]
        return rec


#: The persisted fields besides ``history`` and the lifecycle fields.
BASE_FIELDS = (
    "job_id", "queue", "body", "priority", "enqueued_at", "state", "ready_at", "seq", "attempts",
    "lease_token", "lease_worker", "lease_deadline", "last_error", "result", "finished_at",
    "expires_at", "meta", "cancel_requested", "dedup_s", "group", "start_by",
)
#: Unique key, debounce burst and edits (unique.py, debounce.py, edit.py): persisted only
#: for a job that has one of them.
LIFE_FIELDS = ("unique_key", "unique", "unique_s", "debounce_key", "debounce_first_at",
               "debounce_max_s", "edits", "edited_at")
#: What a snapshot saves and a rollback restores: the key fields are set once, at enqueue.
SCALAR_FIELDS = (*BASE_FIELDS, "edits", "edited_at")


def encode_record(rec: JobRecord) -> bytes:
    """A record as storage keeps it (msgpack of :meth:`JobRecord.to_dict`)."""
    return msgpack.packb(rec.to_dict(), use_bin_type=True)


def decode_record(raw: bytes) -> JobRecord:
    return JobRecord.from_dict(msgpack.unpackb(raw, raw=False, strict_map_key=False))
