"""PURE: job groups (per-key fairness and concurrency), ``enqueue(..., group="tenant-7")``.

Ready jobs of different groups are handed out round-robin, so one group's 10,000 jobs cannot
starve another's one (BullMQ Pro's groups); within a group the order is the queue's own:
priority first, then FIFO. Ungrouped jobs take part in the rotation as one more group. With
``group_concurrency`` a group has at most that many leased jobs at once; with
``group_rate_limit=(n, per_s)`` at most ``n`` claims in any ``per_s`` seconds
(:class:`~.ratelimit.TokenBucket`, one per group).

Lazy, as the queue's heaps are (``heaps.py``): a heap entry is live only while its job is still
ready with that ``seq``; a group's leased set is checked against the records when counted.
Memory: a group exists only while it has ready or leased jobs (then it is dropped, its bucket
with it), and holds its ready entries, at most ``group_concurrency`` leased ids and at most
``n`` bucket entries: bounded by the group's own jobs. Time is passed in, never read.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Any

from ..protocol import MAX_GROUP_BYTES
from .ratelimit import TokenBucket
from .records import LEASED, READY, JobRecord

__all__ = ["MAX_GROUP_BYTES", "REST", "GroupLimits", "Groups"]


Entry = tuple[int, float, int, str]  # (-priority, ready_at, seq, job_id), as the ready heap
REST = ""
"""The rotation's name for the ungrouped jobs (a group name is never empty)."""
MAX_SCAN = 512
"""Groups one look at the rotation examines at most (see :meth:`Groups.peek`)."""


@dataclass(frozen=True, slots=True)
class GroupLimits:
    concurrency: int | None = None
    rate_limit: tuple[int, float] | None = None


class _Group:
    __slots__ = ("name", "ready", "leased", "bucket", "queued")

    def __init__(self, name: str, limits: GroupLimits) -> None:
        self.name = name
        self.ready: list[Entry] = []
        self.leased: set[str] = set()
        self.bucket = TokenBucket(*limits.rate_limit) if limits.rate_limit else None
        self.queued = False  # in the rotation


class Groups:
    """The grouped ready jobs of one queue and the rotation between groups."""

    def __init__(self, jobs: dict[str, JobRecord], limits: GroupLimits,
                 paused: set[str] | None = None) -> None:
        self.jobs = jobs
        self.limits = limits
        # Paused groups (pauses.py; the set is shared, not copied): skipped in the rotation.
        self.paused: set[str] = paused if paused is not None else set()
        self.groups: dict[str, _Group] = {}
        self.ring: deque[str] = deque()  # groups that may have ready jobs, next first
        self.held_back = 0  # claims that found only groups at their limit
        self.rest_queued = False

    def __len__(self) -> int:
        return len(self.groups)

    def entries(self) -> list[Entry]:
        """Every grouped ready heap entry (stale ones included), a snapshot."""
        out: list[Entry] = []
        for group in self.groups.values():
            out += group.ready
        return out

    def push(self, rec: JobRecord, entry: Entry) -> None:
        assert rec.group is not None
        group = self.groups.get(rec.group)
        if group is None:
            group = self.groups[rec.group] = _Group(rec.group, self.limits)
        heapq.heappush(group.ready, entry)
        if not group.queued:
            group.queued = True
            self.ring.append(group.name)

    def note_leased(self, rec: JobRecord) -> None:
        """``rec`` (grouped) is leased now: claimed, restored or rolled back to leased."""
        assert rec.group is not None
        group = self.groups.get(rec.group)
        if group is None:
            group = self.groups[rec.group] = _Group(rec.group, self.limits)
        group.leased.add(rec.job_id)

    def _head(self, group: _Group) -> JobRecord | None:
        ready, jobs = group.ready, self.jobs
        while ready:
            _, _, seq, job_id = ready[0]
            rec = jobs.get(job_id)
            if rec is not None and rec.state == READY and rec.seq == seq \
                    and rec.group == group.name:
                return rec
            heapq.heappop(ready)
        return None

    def leased_count(self, group: _Group) -> int:
        jobs, name = self.jobs, group.name
        live = {j for j in group.leased if (r := jobs.get(j)) is not None
                and r.state == LEASED and r.group == name}
        group.leased = live
        return len(live)

    def _blocked(self, group: _Group, now: float) -> bool:
        cap = self.limits.concurrency
        if cap is not None and self.leased_count(group) >= cap:
            return True
        return group.bucket is not None and group.bucket.available(now) <= 0

    def push_rest(self) -> None:
        """An ungrouped job became ready: the ungrouped heap takes part in the rotation."""
        if not self.rest_queued:
            self.rest_queued = True
            self.ring.append(REST)

    def peek(self, now: float, rest: JobRecord | None) -> tuple[JobRecord | None, str | None]:
        """The next job in the rotation and its group (:data:`REST`: ``rest``, the head of the
        ungrouped heap); ``(None, None)`` when nothing may be claimed now.

        Groups with nothing ready leave the rotation (and are dropped once nothing of theirs
        is leased); groups at a limit are skipped this turn.
        """
        ring, blocked = self.ring, False
        # At most MAX_SCAN turns per look: with thousands of groups at their limit a claim
        # would otherwise walk them all; the rotation moves on, so the next look goes on from
        # there, and a group whose lease ends while it is at its cap comes first (lease_ending).
        for _ in range(min(len(ring), MAX_SCAN)):
            name = ring[0]
            if name == REST:
                if rest is not None:
                    return rest, REST
                ring.popleft()
                self.rest_queued = False
                continue
            group = self.groups.get(name)
            head = None if group is None else self._head(group)
            if group is None or head is None:
                ring.popleft()
                if group is not None:
                    group.queued = False
                    self._maybe_drop(group)
                continue
            if name in self.paused:
                ring.rotate(-1)
                continue
            if self._blocked(group, now):
                blocked = True
                ring.rotate(-1)
                continue
            return head, name
        if rest is not None:  # (not in the rotation yet: pushed before the first group)
            self.push_rest()
            return rest, REST
        if blocked:
            self.held_back += 1
        return None, None

    def lease_ending(self, rec: JobRecord) -> None:
        """``rec``'s lease is ending (acked, failed, expired, released, cancelled): if its
        group was at its concurrency cap, it takes the rotation's next turn, so the claim that
        follows the freed slot finds it however many groups wait at their cap."""
        cap, name = self.limits.concurrency, rec.group
        if cap is None or name is None:
            return
        group = self.groups.get(name)
        if group is None or not group.queued or self.leased_count(group) < cap:
            return
        ring = self.ring
        if ring and ring[0] == name:
            return
        try:
            ring.remove(name)  # (C speed: 20k groups in well under a millisecond)
        except ValueError:
            return
        ring.appendleft(name)

    def take(self, rec: JobRecord, name: str, now: float) -> None:
        """``rec`` (from :meth:`peek`) is being leased: pop it from its group's heap (the
        caller pops the ungrouped heap) and move its turn to the back of the rotation."""
        if name != REST:
            group = self.groups[name]
            heapq.heappop(group.ready)
            group.leased.add(rec.job_id)
            if group.bucket is not None:
                group.bucket.spend(1, now)
        if self.ring and self.ring[0] == name:
            self.ring.rotate(-1)

    def next_token_at(self, now: float) -> float | None:
        """When a group held back only by its rate limit gets a token (None: no such group)."""
        times = [g.bucket.next_token_at(now) for g in self.groups.values()
                 if g.bucket is not None and self._head(g) is not None
                 and g.bucket.available(now) <= 0]
        return min(times) if times else None

    def count_held_back(self, now: float) -> int:
        """Groups with ready jobs that a limit holds back right now (O(groups): stats only)."""
        return sum(1 for g in self.groups.values()
                   if self._head(g) is not None and self._blocked(g, now))

    def _maybe_drop(self, group: _Group) -> None:
        if not group.ready and not group.queued and self.leased_count(group) == 0:
            del self.groups[group.name]

    def oldest_ready_at(self) -> float | None:
        heads = [h.ready_at for g in self.groups.values() if (h := self._head(g)) is not None]
        return min(heads) if heads else None

    def summary(self, now: float, limit: int = 20) -> dict[str, Any]:
        """What ``stats`` shows: how many groups, and the busiest (by ready jobs) with their
        ready and leased counts (O(jobs of the groups): inspection only)."""
        rows: list[dict[str, Any]] = []
        for g in self.groups.values():
            ready = sum(1 for _, _, seq, j in g.ready
                        if (r := self.jobs.get(j)) is not None and r.state == READY
                        and r.seq == seq and r.group == g.name)
            rows.append({"group": g.name, "ready": ready, "leased": self.leased_count(g)})
        rows.sort(key=lambda r: (-r["ready"], -r["leased"], r["group"]))
        return {"count": len(rows), "busiest": rows[:limit],
                "concurrency": self.limits.concurrency,
                "rate_limit": None if self.limits.rate_limit is None
                else list(self.limits.rate_limit),
                "held_back": self.held_back, "held_back_now": self.count_held_back(now)}
