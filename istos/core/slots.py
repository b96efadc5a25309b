"""PURE: the owner's memory of recent schedule slots, so each slot is enqueued once.

A schedule's job id names its slot (``sched:{name}:{slot}``), identical on every node that
declares the schedule. Idempotent enqueue drops a second enqueue of an id only while the queue
still holds that job; a fast job is acked and forgotten before a skewed second node ticks the
same slot. :class:`RecentSlots` closes that window: the owner remembers each accepted slot id
for :func:`hold_s` of its period and refuses the same id again until then, whether or not
the first job has finished.

Bounds: an id is kept for ``max(2 * period, MIN_HOLD_S)`` of the owner's clock, and at most
``capacity`` ids are kept per queue (the one expiring soonest goes first), so memory stays
bounded however many schedules a queue serves. The memory is the owner's RAM: an owner that
restarts or fails over starts empty (jobs still held are deduplicated by id as before).
"""

from __future__ import annotations

import heapq
import math

__all__ = ["DEFAULT_CAPACITY", "MIN_HOLD_S", "RecentSlots", "hold_s"]

MIN_HOLD_S = 60.0
"""Shortest memory of a slot: covers clock skew between nodes ticking sub-minute schedules."""

DEFAULT_CAPACITY = 16_384


def hold_s(period_s: float) -> float:
    """How long a slot of a schedule with this period is remembered (owner clock)."""
    return max(2.0 * period_s, MIN_HOLD_S)


class RecentSlots:
    """Slot ids accepted recently, each until its expiry; never more than ``capacity``."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity!r}")
        self.capacity = capacity
        self._until: dict[str, float] = {}
        # (expiry, id); entries superseded by a later remember() of the same id are skipped.
        self._heap: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._until)

    def seen(self, slot_id: str, now: float) -> bool:
        """Whether ``slot_id`` was remembered and has not expired at ``now``."""
        self._expire(now)
        return slot_id in self._until

    def remember(self, slot_id: str, now: float, period_s: float) -> None:
        """Keep ``slot_id`` for :func:`hold_s` of ``period_s`` (a finite positive number)."""
        if not (math.isfinite(period_s) and period_s > 0):
            raise ValueError(f"a slot period must be a finite number > 0, got {period_s!r}")
        until = max(now + hold_s(period_s), self._until.get(slot_id, -math.inf))
        self._until[slot_id] = until
        heapq.heappush(self._heap, (until, slot_id))
        self._expire(now)
        while len(self._until) > self.capacity:
            self._pop()

    def _expire(self, now: float) -> None:
        while self._heap and self._heap[0][0] <= now:
            self._pop()

    def _pop(self) -> None:
        until, slot_id = heapq.heappop(self._heap)
        if self._until.get(slot_id) == until:
            del self._until[slot_id]
