"""PURE: one queue's jobs and the transitions between their states.

Nothing here does I/O or reads a clock: every operation takes ``now`` (the owner's wall clock) and
randomness comes in as an rng. The owner (``owner.py``) binds this to a transport and storage.

The records and their states are in ``records.py``; lease renewal and cancellation live in
``leasing.py``. Four heaps (``heaps.py``) make every hot-path operation O(log n) with lazy
deletion; ready jobs are claimed by priority, then FIFO by the time each became ready.

Every change is recorded twice for the owner to drain: the records to write through to storage
(``dirty``) and the :class:`~istos.events.JobEvent` s to emit (``events``). With undo tracking on
(durable owners), the first change of a record since the last :meth:`QueueState.take_undo` also
saves a snapshot of it (``undo.py``), so the owner can :meth:`QueueState.rollback` a change whose
write failed (write, then apply: memory never runs ahead of storage).
"""

from __future__ import annotations

import dataclasses
import heapq
import hmac
import random
from collections.abc import Callable
from typing import Any, TypeAlias

from .. import events as ev
from ..events import EventKind, JobEvent
from . import deps_rules as deps
from .backoff import backoff
from .debounce import DebounceKeys
from .dedup import DedupMark, DedupMarks
from .expiry import EXPIRED_ERROR
from .groups import REST, GroupLimits
from .heaps import JobHeaps
from .ratelimit import TokenBucket
from .records import (
    CANCELLED,
    DEAD,
    DELAYED,
    DONE,
    EXPIRED,
    LEASE_EXPIRED_ERROR,
    LEASED,
    READY,
    RELEASED,
    SPARED_ERROR,
    STATES,
    WAITING,
    Attempt,
    JobRecord,
    JobState,
    QueuePolicy,
)
from .undo import Snapshot, put_back, snapshot
from .unique import UniqueKeys, window_after

Change: TypeAlias = JobRecord | str | DedupMark
"""One entry of ``QueueState.dirty``: a record to write, an id to delete, or a dedup mark."""

__all__ = [
    "CANCELLED", "DEAD", "DELAYED", "DONE", "EXPIRED", "LEASED", "LEASE_EXPIRED_ERROR", "READY",
    "RELEASED", "WAITING",
    "Change", "SPARED_ERROR", "STATES", "Attempt", "JobRecord", "JobState", "QueuePolicy",
    "QueueState", "Snapshot",
]


class QueueState:
    """The jobs of one queue. Not thread-safe; the owner calls it from one event loop."""

    def __init__(self, queue: str, policy: QueuePolicy, *, node: str = "",
                 tokens: Callable[[], str] | None = None) -> None:
        self.queue = queue
        # Lease tokens come from the node's id source: unguessable on a live node, seeded in
        # the simulator. Without one (pure tests) a counter makes them unique, not secret.
        self._tokens = tokens
        self.policy = policy
        self.node = node
        self.jobs: dict[str, JobRecord] = {}
        self.dead: dict[str, JobRecord] = {}  # insertion-ordered: oldest dead first
        self.counts = dict.fromkeys(STATES, 0)
        # records to write, ids to delete, or dedup marks to write in place of a record
        self.dirty: list[Change] = []
        self.marks = DedupMarks()  # ids reserved after their jobs finished (dedup windows)
        self.unique = UniqueKeys()  # the unique keys of its jobs (unique.py)
        self.debounce = DebounceKeys()  # the debounce keys of its jobs (debounce.py)
        # The queue's rate limit (None: no limit, and the claim path pays one test for it).
        self.limiter = TokenBucket(*policy.rate_limit) if policy.rate_limit else None
        self.events: list[JobEvent] = []
        self.paused = False
        self._leased = 0
        self.heaps = JobHeaps(self.jobs, GroupLimits(policy.group_concurrency,
                                                     policy.group_rate_limit))
        self.limited = False  # the last claim stopped at a rate or group limit
        self._undo: dict[str, Snapshot] | None = None  # None: undo tracking off

    # -- undo (write, then apply) -----------------------------------------------------------
    def track_undo(self) -> None:
        """Start saving snapshots of changed records (the durable owner's write-then-apply)."""
        if self._undo is None:
            self._undo = {}

    def _save(self, rec: JobRecord) -> None:
        undo = self._undo
        if undo is not None and rec.job_id not in undo:
            undo[rec.job_id] = snapshot(rec)

    def take_undo(self) -> dict[str, Snapshot]:
        """The snapshots saved since the last call (a checkpoint): hand them to the write."""
        undo = self._undo
        if undo is None or not undo:
            return {}
        self._undo = {}
        return undo

    def rollback(self, undo: dict[str, Snapshot]) -> None:
        """Put every record in ``undo`` back as it was (a write of its changes failed), and
        drop the changes and events not yet drained (:func:`~.undo.put_back`)."""
        put_back(self, undo)

    # -- enqueue ---------------------------------------------------------------------------
    def holds(self, job_id: str, now: float | None = None) -> bool:
        """Whether an enqueue of ``job_id`` is a duplicate: the queue holds the job, or (with
        ``now``) its dedup window is still open after it finished."""
        return job_id in self.jobs or (
            now is not None and bool(self.marks) and self.marks.holds(job_id, now))

    def new_record(  # noqa: PLR0913 (the enqueue options, each checked by the schema)
        self, job_id: str, body: bytes, now: float, *, delay_s: float = 0.0, priority: int = 0,
        meta: dict[str, Any] | None = None, dedup_s: float | None = None,
        group: str | None = None, start_by: float | None = None,
    ) -> JobRecord:
        """Build (but do not insert) a record, so the owner can persist it before accepting."""
        rec = JobRecord(job_id=job_id, queue=self.queue, body=body, priority=int(priority),
                        enqueued_at=now, meta=meta, dedup_s=dedup_s or None, group=group,
                        start_by=start_by)
        rec.ready_at = now + max(0.0, delay_s)
        rec.state = DELAYED if delay_s > 0 else READY
        if meta is not None and deps.waits(meta):
            rec.state = WAITING  # its parents release it (deps.py); its delay counts from now
        return rec

    def insert(self, rec: JobRecord, now: float) -> None:
        """Accept a record built by :meth:`new_record`."""
        if self.marks:
            self.marks.drop(rec.job_id)  # an ended window: the sweep must not delete this key
            self.unique.drop_mark(rec.job_id)
        self.jobs[rec.job_id] = rec
        self.counts[rec.state] += 1
        if rec.state == READY:
            self.heaps.push_ready(rec)
        elif rec.state == WAITING:  # in no heap: only its parents' reports move it
            self._inserted_waiting(rec, now)
            return
        else:
            self.heaps.push_delayed(rec)
        if rec.debounce_key is not None:
            self.debounce.note(rec, self.jobs)
        if rec.dedup_s or rec.group is not None or rec.start_by is not None \
                or rec.unique_key is not None:
            # (only when set: the common event stays as it is)
            extra: dict[str, Any] = {}
            if rec.dedup_s:
                extra["dedup_s"] = rec.dedup_s
            if rec.group is not None:
                extra["group"] = rec.group
            if rec.start_by is not None:
                extra["start_by"] = rec.start_by
                self.heaps.starts.push(rec)
            if rec.unique_key is not None:
                self.unique.note(rec)
                extra["unique_key"], extra["unique"] = rec.unique_key, rec.unique
                if rec.unique_s:
                    extra["unique_s"] = rec.unique_s
            self._emit(now, rec, ev.ENQUEUED, priority=rec.priority,
                       delay_s=max(0.0, rec.ready_at - now), ready_at=rec.ready_at, **extra)
            return
        self._emit(now, rec, ev.ENQUEUED, priority=rec.priority,
                   delay_s=max(0.0, rec.ready_at - now), ready_at=rec.ready_at)

    def _inserted_waiting(self, rec: JobRecord, now: float) -> None:
        """The rest of :meth:`insert` for a child stored to wait: its keys are held as
        any job's; its start deadline counts once it is released (:meth:`unblock`)."""
        if rec.debounce_key is not None:
            self.debounce.note(rec, self.jobs)
        if rec.unique_key is not None:
            self.unique.note(rec)
        self._emit(now, rec, ev.WAITING, priority=rec.priority, ready_at=rec.ready_at,
                   parents=len(rec.meta[deps.META]["after"]) if rec.meta else 0)

    def enqueue(self, job_id: str, body: bytes, now: float, *,  # noqa: PLR0913 (as new_record)
                delay_s: float = 0.0,
                priority: int = 0, meta: dict[str, Any] | None = None,
                dedup_s: float | None = None, group: str | None = None,
                start_by: float | None = None) -> bool:
        """Insert a job; False (and no change) if the queue already holds ``job_id`` or its
        dedup window is open."""
        if job_id in self.jobs:
            self._emit(now, self.jobs[job_id], ev.DUPLICATE_ENQUEUE)
            return False
        if self.marks and self.marks.holds(job_id, now):
            self.duplicate_of_mark(job_id, now)
            return False
        rec = self.new_record(job_id, body, now, delay_s=delay_s, priority=priority, meta=meta,
                              dedup_s=dedup_s, group=group, start_by=start_by)
        self.insert(rec, now)
        self.dirty.append(rec)
        return True

    def duplicate_of_mark(self, job_id: str, now: float) -> None:
        """Record the ``duplicate_enqueue`` event of an id whose dedup window is open."""
        self.events.append(JobEvent(now, self.node, self.queue, job_id, ev.DUPLICATE_ENQUEUE,
                                    0, None, {"dedup_until": self.marks.until(job_id)}))

    # -- claim -----------------------------------------------------------------------------
    def claim(self, workers: list[str], now: float, *, budget: int | None = None,
              size_of: Callable[[JobRecord, str], int] | None = None) -> list[JobRecord]:
        """Lease up to one job per entry of ``workers`` (worker slot ids), best first.

        With ``budget`` and ``size_of``, stop before the job whose size would take the total
        past ``budget`` (the first job is always leased), leaving it ready at the head.
        """
        if self.paused:
            return []
        if self.heaps.starts.heap:  # (wake_due, inline: most queues have no start deadline)
            self.expire_due(now)
        self.promote_due(now)
        self.limited = False
        limiter = self.limiter
        if limiter is not None:
            workers = self._within_limit(limiter, workers, now)
        heaps = self.heaps
        sized = budget is not None and size_of is not None and len(workers) > 1
        if heaps.groups is not None or sized:
            out = self._claim_grouped_or_sized(workers, now, budget if sized else None, size_of)
        else:  # the plain queue's claim: the best ready jobs, one per slot
            out = []
            for worker in workers:
                rec = heaps.peek_ready()
                if rec is None:
                    break
                heapq.heappop(heaps.ready)
                self._lease(rec, worker, now)
                out.append(rec)
        if limiter is not None:
            limiter.spend(len(out), now)
        return out

    def _claim_grouped_or_sized(self, workers: list[str], now: float, budget: int | None,
                                size_of: Callable[[JobRecord, str], int] | None
                                ) -> list[JobRecord]:
        """:meth:`claim`'s loop for a queue with fairness groups or a claim with a size
        budget over several slots (``budget`` None: no size limit)."""
        out: list[JobRecord] = []
        used = 0
        sized = budget is not None and size_of is not None
        groups = self.heaps.groups
        name = REST
        for worker in workers:
            if groups is None:
                rec = self.heaps.peek_ready()
            else:  # round-robin between groups (groups.py)
                rec, turn = groups.peek(now, self.heaps.peek_ready())
                if rec is None:
                    self.limited = self.limited or turn is None and bool(self.counts[READY])
                    break
                name = turn or REST
            if rec is None:
                break
            if sized:  # (one slot: its job is leased whatever its size)
                assert budget is not None and size_of is not None
                used += size_of(rec, worker)
                if out and used > budget:
                    break
            if groups is None or name == REST:
                heapq.heappop(self.heaps.ready)
            if groups is not None:
                groups.take(rec, name, now)
            self._lease(rec, worker, now)
            out.append(rec)
        return out

    def _within_limit(self, limiter: TokenBucket, workers: list[str], now: float) -> list[str]:
        """The slots the rate limit lets claim now; the others are counted as throttled
        while jobs are ready for them."""
        allowed = limiter.available(now)
        if allowed >= len(workers):
            return workers
        ready = self.counts[READY]
        if ready:
            limiter.throttled += min(len(workers) - max(0, allowed), ready)
            self.limited = True
        return workers[:max(0, allowed)]

    def throttled_until(self, now: float) -> float | None:
        """When the rate limit next lets a claim through, if it holds back ready jobs now
        (None: no limit, nothing ready, or tokens left)."""
        limiter = self.limiter
        if not self.counts[READY]:
            return None
        if limiter is not None and limiter.available(now) <= 0:
            return limiter.next_token_at(now)
        groups = self.heaps.groups
        return None if groups is None else groups.next_token_at(now)

    def _lease(self, rec: JobRecord, worker: str, now: float) -> None:
        self._save(rec)
        self._move(rec, LEASED)
        rec.attempts += 1
        self._leased += 1
        rec.lease_token = self._tokens() if self._tokens is not None else f"t{self._leased}"
        rec.lease_worker = worker
        rec.lease_deadline = now + self.policy.lease_s
        self.heaps.push_lease(rec, rec.lease_deadline)
        attempt = Attempt(rec.attempts, worker, now)
        if isinstance(rec.history, tuple):  # the first attempt (records.py: why a tuple)
            rec.history = [attempt]
        else:
            rec.history.append(attempt)
            if len(rec.history) > self.policy.history_limit:
                # keep the first attempt: it says how the job's story started
                del rec.history[1]
        self.dirty.append(rec)
        self._emit(now, rec, ev.CLAIMED, worker=worker,
                   deadline=rec.lease_deadline, lease_s=self.policy.lease_s)

    # -- ack / nack --------------------------------------------------------------------------
    def holder(self, job_id: str, token: str) -> JobRecord | None:
        """The record if ``token`` is its latest lease and that delivery has not ended.

        The one token check: ack, nack (and any lease extension) go through it. Compared in
        constant time, so response timing does not leak a token's prefix.
        """
        rec = self.jobs.get(job_id)
        if rec is None or rec.lease_token is None:
            return None
        try:  # str compare: both ASCII (the schema says so for tokens from the wire)
            if not hmac.compare_digest(rec.lease_token, token):
                return None
        except TypeError:  # a non-ASCII token from a direct caller: not one we issued
            return None
        if rec.state == LEASED:
            return rec
        # The lease expired and the sweeper put the job back, but nobody claimed it again: the
        # late answer is still the latest delivery's, so honour it rather than run it twice.
        if rec.state in (READY, DELAYED) and rec.history and \
                rec.history[-1].outcome == ev.LEASE_EXPIRED:
            return rec
        return None

    def ack(self, job_id: str, token: str, now: float, result: bytes | None = None) -> str:
        """Finish a delivery. Returns "ok", or "stale" if that lease is no longer the job's."""
        rec = self.holder(job_id, token)
        if rec is None:
            return "stale"
        self._save(rec)
        self._finish_attempt(rec, now, ev.ACKED, None)
        self._emit(now, rec, ev.ACKED, worker=rec.lease_worker)
        if self.policy.keep_results:
            self._move(rec, DONE)
            rec.result = result
            rec.finished_at = now
            rec.expires_at = now + self.policy.result_ttl_s
            self.heaps.push_expiry(rec.expires_at, rec.job_id)
            self.dirty.append(rec)
        else:
            self._forget(rec, now)
        return "ok"

    def nack(self, job_id: str, token: str, now: float, error: str, rng: random.Random,
             traceback: str | None = None, *, retry_after: float | None = None) -> str:
        """Fail a delivery: back off and retry, or dead-letter after ``max_attempts``.
        ``traceback`` (already cut to size) is kept with the attempt's history entry.

        ``retry_after`` (the worker raised :class:`~istos.errors.Retry`): wait that long
        instead of the backoff curve, capped by the policy's ``max_s``; the attempt counts.
        """
        rec = self.holder(job_id, token)
        if rec is None:
            return "stale"
        self._emit(now, rec, ev.NACKED, worker=rec.lease_worker, error=error)
        self._fail(rec, now, ev.NACKED, error, rng, traceback, retry_after)
        return "ok"

    def release(self, job_id: str, token: str, now: float) -> str:
        """Hand a delivery back unfinished (its worker shut down, or the job's lease would end
        while it waited behind others in the worker's prefetch): ready again at once, and
        the attempt does not count. Returns "ok", or "stale" as :meth:`ack` does."""
        rec = self.holder(job_id, token)
        if rec is None:
            return "stale"
        self._spare(rec, now, RELEASED, "handed back unfinished by its worker")
        return "ok"

    def _spare(self, rec: JobRecord, now: float, outcome: str, error: str) -> None:
        """Back to ready without counting the attempt (it was not the job's fault)."""
        self._save(rec)
        self._finish_attempt(rec, now, outcome, error, backoff_s=0.0)
        rec.attempts = max(0, rec.attempts - 1)
        rec.ready_at = now
        if rec.state != READY:
            self._move(rec, READY)
        self.heaps.push_ready(rec)
        if rec.start_by is not None:  # handed back unrun: its start deadline holds again
            self.heaps.starts.push(rec)
        self._emit(now, rec, ev.RETRY_SCHEDULED, delay_s=0.0, ready_at=now, error=error,
                   spared=True)
        self.dirty.append(rec)

    def _fail(self, rec: JobRecord, now: float, outcome: str, error: str,
              rng: random.Random | None, traceback: str | None = None,
              retry_after: float | None = None) -> None:
        self._save(rec)
        rec.last_error = error
        if traceback is not None:
            keep_traceback(rec, traceback, self.policy.tracebacks_kept)
        if rec.cancel_requested:  # a cancelled job is never retried nor dead-lettered
            self._finish_attempt(rec, now, outcome, error)
            self.end_cancelled(rec, now)
            return
        if rec.attempts >= self.policy.max_attempts:
            self._finish_attempt(rec, now, outcome, error)
            self._move(rec, DEAD)
            rec.finished_at = now
            self.dead[rec.job_id] = rec
            self._emit(now, rec, ev.DEAD_LETTERED, error=error)
        else:
            extra: dict[str, Any] = {}
            if retry_after is not None:
                delay = min(max(0.0, retry_after), self.policy.backoff.max_s)
                extra["retry_after"] = retry_after
            else:
                delay = backoff(rec.attempts, self.policy.backoff, rng) if rng is not None \
                    else 0.0
            self._finish_attempt(rec, now, outcome, error, backoff_s=delay)
            rec.ready_at = now + delay
            if delay > 0:
                self._move(rec, DELAYED)
                self.heaps.push_delayed(rec)
            else:
                self._move(rec, READY)
                self.heaps.push_ready(rec)
            self._emit(now, rec, ev.RETRY_SCHEDULED, delay_s=delay, ready_at=rec.ready_at,
                       error=error, **extra)
        self.dirty.append(rec)

    def end_cancelled(self, rec: JobRecord, now: float) -> None:
        """Move ``rec`` to ``cancelled``, kept (like a done job) for ``result_ttl_s``."""
        self._save(rec)  # a failed write puts it back (write, then apply)
        self._move(rec, CANCELLED)
        rec.finished_at = now
        rec.expires_at = now + self.policy.result_ttl_s
        self.heaps.push_expiry(rec.expires_at, rec.job_id)
        self.dirty.append(rec)
        self._emit(now, rec, ev.CANCELLED, worker=rec.lease_worker)

    def _finish_attempt(self, rec: JobRecord, now: float, outcome: str, error: str | None,
                        backoff_s: float | None = None) -> None:
        if rec.history and rec.history[-1].attempt == rec.attempts:
            last = rec.history[-1]
            last.finished_at, last.outcome, last.error = now, outcome, error
            last.backoff_s = backoff_s

    # -- time-driven transitions ---------------------------------------------------------------
    def sweep(self, now: float, spare_claimed_by: float | None = None) -> int:
        """Reclaim expired leases (back to ready, or dead if out of attempts) and expire results.

        Returns the number of leases reclaimed. A lease is expired once ``now >= deadline``.
        A lease claimed at or before ``spare_claimed_by`` (the owner's last failed storage write)
        overlapped a storage outage: its worker may have been unable to ack, so it goes back to
        ready without counting the attempt.
        """
        reclaimed = 0
        for rec, deadline in self.heaps.pop_expired_leases(now):
            reclaimed += 1
            self._emit(now, rec, ev.LEASE_EXPIRED, worker=rec.lease_worker, deadline=deadline)
            claimed_at = rec.history[-1].claimed_at if rec.history else now
            if spare_claimed_by is not None and claimed_at <= spare_claimed_by:
                self._spare(rec, now, ev.LEASE_EXPIRED, SPARED_ERROR)
            else:
                self._fail(rec, now, ev.LEASE_EXPIRED, LEASE_EXPIRED_ERROR, None)
        for rec in self.heaps.pop_expired_results(now):
            self._emit(now, rec, ev.RESULT_EXPIRED)
            self._forget(rec, now)
        if self.marks:
            # Ended windows: delete their marks (never a key a live record holds again).
            ended = self.marks.pop_expired(now)
            if self.unique:
                for j in ended:
                    self.unique.drop_mark(j)
            self.dirty.extend(j for j in ended if j not in self.jobs)
        self.wake_due(now)
        return reclaimed

    def wake_due(self, now: float) -> int:
        """Expire the waiting jobs past their start deadline (never handed out late), then
        promote the delayed jobs that are due; returns how many were promoted."""
        if self.heaps.starts.heap:
            self.expire_due(now)
        return self.promote_due(now)

    def expire_due(self, now: float) -> int:
        """End every waiting job that never started and whose start deadline is at or before
        ``now`` as ``expired`` (``expiry.py``); returns how many."""
        ended = 0
        for rec in self.heaps.starts.pop_due(self.jobs, now):
            self._save(rec)
            self._move(rec, EXPIRED)
            rec.last_error = EXPIRED_ERROR
            rec.finished_at = now
            rec.expires_at = now + self.policy.result_ttl_s
            self.heaps.push_expiry(rec.expires_at, rec.job_id)
            self.dirty.append(rec)
            self._emit(now, rec, ev.EXPIRED, start_by=rec.start_by)
            ended += 1
        return ended

    def promote_due(self, now: float) -> int:
        """Move delayed jobs whose time has come onto the ready heap, in ``ready_at`` order."""
        moved = 0
        for rec in self.heaps.pop_due(now):
            self._move(rec, READY)
            self.heaps.push_ready(rec)
            moved += 1
        return moved

    def next_deadline_hint(self) -> float:
        """A lower bound of :meth:`next_deadline` in O(1) (stale heads not dropped)."""
        return self.heaps.next_deadline_hint()

    def next_deadline(self) -> float | None:
        """The earliest time at which :meth:`sweep` or :meth:`promote_due` has work to do.

        Stale heap heads (leases already acked, delays already promoted) are dropped first, so
        the owner's timer never wakes for work that is gone.
        """
        deadline = self.heaps.next_deadline()
        if self.marks:
            ends = self.marks.next_expiry()
            if ends is not None and (deadline is None or ends < deadline):
                return ends
        return deadline

    # -- recovery and admin ----------------------------------------------------------------------
    def restore(self, rec: JobRecord, now: float) -> None:
        """Re-insert a record loaded from storage after a restart.

        A leased job gets a fresh full lease on *this* owner's clock: the old deadline was read on
        another clock (or before a pause), and honouring it could reclaim a live worker's job early.
        """
        if rec.job_id in self.jobs:
            return
        if rec.state == LEASED:
            rec.lease_deadline = now + self.policy.lease_s
        self.jobs[rec.job_id] = rec
        if rec.unique_key is not None:
            self.unique.note_restored(rec, self.jobs)
        if rec.debounce_key is not None:
            self.debounce.note(rec, self.jobs)
        self.counts[rec.state] += 1
        if rec.state in (READY, DELAYED):
            self.heaps.starts.push(rec)  # (none without a start deadline)
        if rec.state == READY:
            self.heaps.push_ready(rec)
        elif rec.state == DELAYED:
            self.heaps.push_delayed(rec)
        elif rec.state == DEAD:
            self.dead[rec.job_id] = rec
        else:
            self.heaps.reinsert(rec, now)

    def restore_mark(self, mark: DedupMark) -> None:
        """Re-insert a dedup mark loaded from storage (an ended one is deleted by the sweep)."""
        if mark.job_id not in self.jobs:
            self.marks.add(mark.job_id, mark.until)
            if mark.unique_key is not None:
                self.unique.mark(mark.unique_key, mark.job_id, mark.until)

    def purge_dead(self, now: float, job_ids: list[str] | None = None) -> int:
        ids = list(self.dead) if job_ids is None else [j for j in job_ids if j in self.dead]
        for job_id in ids:
            rec = self.dead[job_id]
            self._emit(now, rec, ev.PURGED)
            self._forget(rec, now)
        return len(ids)

    def revive_dead(self, job_id: str, now: float) -> JobRecord | None:
        """Move dead job ``job_id`` back to ready under the same id, afresh (attempts 0, no
        history; body, priority and meta kept, so a workflow step still continues). Returns
        the new record, or None when ``job_id`` is not a dead letter."""
        rec = self.dead.get(job_id)
        if rec is None:
            return None
        self._forget(rec)  # queues a delete, which the write of the fresh record overrides
        fresh = self.new_record(job_id, rec.body, now, priority=rec.priority, meta=rec.meta)
        if fresh.state == WAITING:  # a child that ran once (promoted) waits no more
            fresh.state = READY
        self.insert(fresh, now)  # emits "enqueued" and makes it claimable
        self.dirty.append(fresh)
        return fresh

    # -- the public edits other core modules make (edit.py, debounce.py, leasing.py) --------
    def edit_waiting(self, rec: JobRecord, now: float, *, body: bytes | None = None,
                     start: float | None = None, priority: int | None = None,
                     detail: dict[str, Any] | None = None) -> None:
        """Edit waiting job ``rec`` (ready or delayed, held by this queue) as one change of
        its record: given ``body``, it carries that data from now on; given ``priority`` or
        ``start``, it gets a fresh place in the queue (``start`` not after ``now``: ready,
        behind the jobs ready already; later: delayed until then). Counts an edit and emits
        ``updated`` with ``detail``. The write is the caller's (the owner's write path); a
        failed one puts the record back (it is snapshotted first)."""
        self._save(rec)
        if body is not None:
            rec.body = body
        moved = False
        if priority is not None and priority != rec.priority:
            rec.priority = priority
            moved = True
        if start is not None:
            rec.ready_at = start
            moved = True
        if moved:  # a fresh heap entry (the old one is stale by its seq: lazy deletion)
            target: JobState = DELAYED if rec.ready_at > now else READY
            if rec.state != target:
                self._move(rec, target)
            if target == READY:
                self.heaps.push_ready(rec)
            else:
                self.heaps.push_delayed(rec)
        rec.edits = (rec.edits or 0) + 1
        rec.edited_at = now
        self.dirty.append(rec)
        self._emit(now, rec, ev.UPDATED, **(detail or {}))

    def change(self, rec: JobRecord, apply: Callable[[JobRecord], bool]) -> bool:
        """Change held record ``rec`` in place by ``apply`` (which returns whether it changed
        anything) as one stored change: snapshotted first (a failed write puts it back), and,
        if changed, written with the next commit. Returns what ``apply`` returned. For
        fields no transition owns (logs, a cancel mark); its events go by :meth:`note`."""
        self._save(rec)
        changed = apply(rec)
        if changed:
            self.dirty.append(rec)
        return changed

    def note(self, now: float, rec: JobRecord, kind: EventKind, worker: str | None = None,
             **detail: Any) -> None:
        """Emit event ``kind`` of held job ``rec`` with the next drain: a change made through
        :meth:`change`, or one that is not stored (a lease renewal, progress)."""
        self._emit(now, rec, kind, worker, **detail)

    def unblock(self, rec: JobRecord, now: float, *, forced: bool = False) -> None:
        """Move waiting ``rec`` on: ready now (behind the jobs already ready), or delayed
        until its ``ready_at`` if its own delay has not passed. Emits ``unblocked``
        (``forced``: an operator's promote, not its parents)."""
        self._save(rec)
        rec.ready_at = max(rec.ready_at, now)
        if rec.ready_at > now:
            self._move(rec, DELAYED)
            self.heaps.push_delayed(rec)
        else:
            self._move(rec, READY)
            self.heaps.push_ready(rec)
        if rec.start_by is not None:
            self.heaps.starts.push(rec)
        self.dirty.append(rec)
        detail: dict[str, Any] = {"delay_s": rec.ready_at - now, "ready_at": rec.ready_at,
                                  "priority": rec.priority}
        if forced:
            detail["forced"] = True
        self._emit(now, rec, ev.UNBLOCKED, **detail)

    def set_meta(self, rec: JobRecord, meta: dict[str, Any]) -> None:
        """Replace ``rec``'s meta (a new dict: an undo snapshot keeps the old one)."""
        self._save(rec)
        rec.meta = meta
        self.dirty.append(rec)

    def promote(self, job_id: str, now: float) -> bool:
        """Make delayed job ``job_id`` ready now (it queues behind the jobs already ready);
        False when it is neither delayed nor waiting. Emits ``retry_scheduled`` with
        ``promoted``; a waiting job (an operator releasing it whatever its parents) emits
        ``unblocked`` with ``forced``."""
        rec = self.jobs.get(job_id)
        if rec is not None and rec.state == WAITING:
            self.unblock(rec, now, forced=True)
            return True
        if rec is None or rec.state != DELAYED:
            return False
        self._save(rec)
        self._move(rec, READY)
        rec.ready_at = now
        self.heaps.push_ready(rec)  # the delayed heap's entry is stale now (lazy deletion)
        self.dirty.append(rec)
        self._emit(now, rec, ev.RETRY_SCHEDULED, delay_s=0.0, ready_at=now, promoted=True)
        return True

    def oldest_ready_at(self) -> float | None:
        """The ``ready_at`` of the job at the head of the ready heap (lazily cleaned)."""
        rec = self.heaps.peek_ready()
        oldest = None if rec is None else rec.ready_at
        groups = self.heaps.groups
        if groups is not None:
            grouped = groups.oldest_ready_at()
            if grouped is not None and (oldest is None or grouped < oldest):
                return grouped
        return oldest

    # -- internals ---------------------------------------------------------------------------
    def _move(self, rec: JobRecord, state: JobState) -> None:
        if rec.state == LEASED and state != LEASED:
            self._lease_ending(rec)
        elif rec.state == READY and state != READY and self.heaps.order is not None:
            self.heaps.order.discard(rec.job_id)
        self.counts[rec.state] -= 1
        self.counts[state] += 1
        rec.state = state

    def _forget(self, rec: JobRecord, now: float | None = None) -> None:
        """Drop ``rec``; with ``now`` and an open dedup window, its id stays reserved (a mark
        written in place of the record: one atomic write, see ``dedup.py``)."""
        self._save(rec)
        if rec.state == LEASED:
            self._lease_ending(rec)
        elif rec.state == READY and self.heaps.order is not None:
            self.heaps.order.discard(rec.job_id)
        self.counts[rec.state] -= 1
        del self.jobs[rec.job_id]
        self.dead.pop(rec.job_id, None)
        if rec.debounce_key is not None:
            self.debounce.forget(rec)
        window = rec.dedup_s if rec.unique_key is None else window_after(rec)
        if window and now is not None:
            until = (now if rec.finished_at is None else rec.finished_at) + window
            if until > now:
                self.marks.add(rec.job_id, until)
                if rec.unique_key is not None:
                    self.unique.mark(rec.unique_key, rec.job_id, until)
                self.dirty.append(DedupMark(rec.job_id, until, rec.unique_key))
                return
        if rec.unique_key is not None:
            self.unique.forget(rec)
        self.dirty.append(rec.job_id)

    def _lease_ending(self, rec: JobRecord) -> None:
        """A grouped job's lease ends: its group, if it was at its cap, goes next (groups.py)."""
        groups = self.heaps.groups
        if groups is not None and rec.group is not None:
            groups.lease_ending(rec)

    def _emit(self, now: float, rec: JobRecord, kind: EventKind, worker: str | None = None,
              **detail: Any) -> None:
        self.events.append(JobEvent(now, self.node, self.queue, rec.job_id, kind,
                                    rec.attempts, worker, detail))

    def drain(self) -> tuple[list[Change], list[JobEvent]]:
        """Hand the owner what changed since the last drain."""
        dirty, events = self.dirty, self.events
        self.dirty, self.events = [], []
        return dirty, events


def keep_traceback(rec: JobRecord, traceback: str, kept: int) -> None:
    """Attach ``traceback`` to ``rec``'s current attempt; only the newest ``kept`` failed
    attempts keep theirs, so a record (and a ``why`` or dead-letter reply) stays within a
    frame whatever the history limit."""
    if not rec.history or rec.history[-1].attempt != rec.attempts:
        return
    rec.history[-1].traceback = traceback
    seen = 0
    for i in range(len(rec.history) - 1, -1, -1):
        if rec.history[i].traceback is not None:
            seen += 1
            if seen > kept:  # a copy, not in place: an undo snapshot shares older attempts
                rec.history[i] = dataclasses.replace(rec.history[i], traceback=None)

