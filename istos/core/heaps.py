"""PURE: the four timer/priority heaps of one queue, with lazy deletion.

Every hot-path operation is O(log n): an entry is never removed in place; it is live only while
its job is still in the state, and the attempt, that pushed it, and a stale one is discarded
when it surfaces (as in simpy's and trio's timer heaps). Ready jobs are ordered by
(-priority, ready_at, seq): higher priority first, then FIFO by the time each job *became*
ready, so a delayed or retried job queues behind those that were waiting before it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from .expiry import StartDeadlines
from .groups import GroupLimits, Groups
from .ready_order import ReadyOrder
from .records import CANCELLED, DELAYED, DONE, EXPIRED, LEASED, READY, JobRecord


class JobHeaps:
    """The ready, delayed, lease and result-expiry heaps over one queue's ``jobs``."""

    __slots__ = ("jobs", "ready", "delayed", "leases", "expiry", "seq", "groups", "group_limits",
                 "paused_groups", "starts", "order")

    def __init__(self, jobs: dict[str, JobRecord],
                 group_limits: GroupLimits | None = None) -> None:
        self.jobs = jobs  # the queue's records (shared, not copied): liveness reads them
        # Grouped ready jobs wait in their group's heap (groups.py), made at the first one;
        # a queue that never sees a group pays one test per push.
        self.groups: Groups | None = None
        self.group_limits = group_limits or GroupLimits()
        self.paused_groups: set[str] = set()  # (pauses.py) the groups' rotation skips these
        self.ready: list[tuple[int, float, int, str]] = []
        self.delayed: list[tuple[float, int, str]] = []
        self.leases: list[tuple[float, str, str]] = []  # (deadline, token, job_id)
        self.expiry: list[tuple[float, str]] = []
        self.starts = StartDeadlines()  # jobs with a start deadline (expiry.py)
        # Every ready job, grouped or not, in claim order: made by the first `why` that asks
        # (ready_order.py), so a queue nobody inspects pays nothing for it.
        self.order: ReadyOrder | None = None
        self.seq = 0

    # -- pushes ------------------------------------------------------------------------------
    def push_ready(self, rec: JobRecord) -> None:
        """Queue ``rec`` as ready, behind every job that became ready before it."""
        self.seq += 1
        rec.seq = self.seq
        entry = (-rec.priority, rec.ready_at, rec.seq, rec.job_id)
        if self.order is not None:
            self.order.add(rec.job_id, entry)
        if rec.group is not None:
            self.grouped().push(rec, entry)
            return
        heapq.heappush(self.ready, entry)
        if self.groups is not None:
            self.groups.push_rest()

    def ready_entries(self) -> list[tuple[int, float, int, str]]:
        """A snapshot of every ready heap entry, grouped or not, stale ones included (the
        seed of the index of ready jobs: ready_order.py)."""
        entries = list(self.ready)
        if self.groups is not None:
            entries += self.groups.entries()
        return entries

    def grouped(self) -> Groups:
        """The queue's groups (made at the first grouped job)."""
        groups = self.groups
        if groups is None:
            groups = self.groups = Groups(self.jobs, self.group_limits,
                                          self.paused_groups)
            if self.ready:
                groups.push_rest()  # ungrouped jobs waiting already keep their turn
        return groups

    def push_delayed(self, rec: JobRecord) -> None:
        self.seq += 1
        rec.seq = self.seq
        heapq.heappush(self.delayed, (rec.ready_at, rec.seq, rec.job_id))

    def push_lease(self, rec: JobRecord, deadline: float) -> None:
        heapq.heappush(self.leases, (deadline, rec.lease_token or "", rec.job_id))

    def push_expiry(self, expires_at: float, job_id: str) -> None:
        heapq.heappush(self.expiry, (expires_at, job_id))

    def reinsert(self, rec: JobRecord, lease_default: float) -> None:
        """Push ``rec`` as its state needs, keeping its ``seq`` (a record put back as it was).

        Heap entries left from before are harmless duplicates: each is checked on its way out.
        Dead records are not in any heap (the caller keeps them in its dead list).
        """
        if rec.start_by is not None and rec.state in (READY, DELAYED):
            self.starts.push(rec)
        if rec.state == READY:
            entry = (-rec.priority, rec.ready_at, rec.seq, rec.job_id)
            if self.order is not None:
                self.order.add(rec.job_id, entry)
            if rec.group is not None:
                self.grouped().push(rec, entry)
            else:
                heapq.heappush(self.ready, entry)
                if self.groups is not None:
                    self.groups.push_rest()
        elif rec.state == DELAYED:
            heapq.heappush(self.delayed, (rec.ready_at, rec.seq, rec.job_id))
        elif rec.state == LEASED:
            deadline = rec.lease_deadline if rec.lease_deadline is not None else lease_default
            self.push_lease(rec, deadline)
            if rec.group is not None:  # restored or rolled back: it counts for its group
                self.grouped().note_leased(rec)
        elif rec.state in (DONE, CANCELLED, EXPIRED):
            if rec.expires_at is not None:
                self.push_expiry(rec.expires_at, rec.job_id)

    # -- liveness ----------------------------------------------------------------------------
    def live_lease(self, token: str, job_id: str, deadline: float) -> JobRecord | None:
        # An extended lease (leasing.extend) pushed a later entry: the earlier one is stale.
        rec = self.jobs.get(job_id)
        return rec if rec is not None and rec.state == LEASED and rec.lease_token == token \
            and rec.lease_deadline == deadline else None

    def live_delay(self, seq: int, job_id: str) -> JobRecord | None:
        rec = self.jobs.get(job_id)
        return rec if rec is not None and rec.state == DELAYED and rec.seq == seq else None

    def live_result(self, expires_at: float, job_id: str) -> JobRecord | None:
        rec = self.jobs.get(job_id)
        return rec if rec is not None and rec.state in (DONE, CANCELLED, EXPIRED) \
            and rec.expires_at == expires_at else None

    def peek_ready(self) -> JobRecord | None:
        """The best ready job (stale heads dropped on the way), left on the heap."""
        ready = self.ready
        while ready:
            _, _, seq, job_id = ready[0]
            rec = self.jobs.get(job_id)
            if rec is not None and rec.state == READY and rec.seq == seq:
                return rec
            heapq.heappop(ready)
        return None

    def pop_ready(self) -> JobRecord | None:
        rec = self.peek_ready()
        if rec is not None:
            heapq.heappop(self.ready)
        return rec

    # -- time-driven pops (lazy: the caller may change the heaps between two items) ---------
    def pop_expired_leases(self, now: float) -> Iterator[tuple[JobRecord, float]]:
        """Each live lease whose deadline is at or before ``now``, with that deadline."""
        leases = self.leases
        while leases and leases[0][0] <= now:
            deadline, token, job_id = heapq.heappop(leases)
            rec = self.live_lease(token, job_id, deadline)
            if rec is not None:
                yield rec, deadline

    def pop_expired_results(self, now: float) -> Iterator[JobRecord]:
        """Each live done or cancelled record whose ``expires_at`` is at or before ``now``."""
        expiry = self.expiry
        while expiry and expiry[0][0] <= now:
            expires_at, job_id = heapq.heappop(expiry)
            rec = self.live_result(expires_at, job_id)
            if rec is not None:
                yield rec

    def pop_due(self, now: float) -> Iterator[JobRecord]:
        """Each live delayed record whose ``ready_at`` is at or before ``now``, in that order."""
        delayed = self.delayed
        while delayed and delayed[0][0] <= now:
            _, seq, job_id = heapq.heappop(delayed)
            rec = self.live_delay(seq, job_id)
            if rec is not None:
                yield rec

    # -- deadlines ---------------------------------------------------------------------------
    def next_deadline_hint(self) -> float:
        """A lower bound of :meth:`next_deadline` in O(1) (stale heads not dropped)."""
        heads = [h[0][0] for h in (self.leases, self.delayed, self.expiry) if h]
        hint = min(heads) if heads else float("inf")
        return min(hint, self.starts.hint()) if self.starts.heap else hint

    def next_deadline(self) -> float | None:
        """The earliest lease deadline, delay or result expiry still live (stale heads dropped
        first, so the owner's timer never wakes for work that is gone)."""
        leases, delayed, expiry = self.leases, self.delayed, self.expiry
        while leases and self.live_lease(leases[0][1], leases[0][2], leases[0][0]) is None:
            heapq.heappop(leases)
        while delayed and self.live_delay(delayed[0][1], delayed[0][2]) is None:
            heapq.heappop(delayed)
        while expiry and self.live_result(expiry[0][0], expiry[0][1]) is None:
            heapq.heappop(expiry)
        heads = [h[0][0] for h in (leases, delayed, expiry) if h]
        if self.starts:
            start = self.starts.next_at(self.jobs)
            if start is not None:
                heads.append(start)
        return min(heads) if heads else None



