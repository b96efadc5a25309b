"""Per-owner event sequence numbers, so a follower can say what it missed.

Every event of a queue gets the next number of its owner's sequence: ``(epoch, n)``, ``epoch``
a fresh id each time an owner starts serving the queue (a restart or a failover begins a new
one), ``n`` counting from 1. Live batches carry the numbers of their events; the
``events_since`` op (read role) answers the events after ``(epoch, after)`` from a bounded ring
of the newest :data:`RESUME_RING` events, and ``missed``: how many of those the ring no longer
holds (exact within one epoch; for an older epoch, the new owner's own events that fell out of
its ring -- what the old owner emitted after the follower's last event is gone with it).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ...clock import Clock
from ...codec import Packed, Spliced
from ...events import JobEvent
from ..views.slicing import packed_page

RESUME_RING = 10_000  # events kept for followers that come back (about 1 MB: shared objects)
SEQ_BYTES = 9  # the most one number takes in the reply's seqs (counted with its event's bytes)


class EventSequence:
    """Numbers one queue's events and keeps the newest for ``events_since``."""

    def __init__(self, epoch: str) -> None:
        self.epoch = epoch
        self.last = 0
        self._ring: deque[tuple[int, JobEvent]] = deque(maxlen=RESUME_RING)
        self._packed: dict[int, bytes] = {}  # the last page's encoded events, by number

    def number(self, event: JobEvent) -> int:
        self.last += 1
        self._ring.append((self.last, event))
        return self.last

    async def since(self, epoch: str | None, after: int, limit: int,
                    clock: Clock) -> dict[str, Any]:
        """The reply of ``events_since``: events numbered above ``after`` of this epoch
        (every event kept, when ``epoch`` is another one), paged by count and bytes (in
        slices of the loop's time, over a snapshot of the ring)."""
        start = after if epoch == self.epoch else 0
        if start > self.last:  # a number this epoch never gave: the follower is confused
            start = self.last
        first_kept = self._ring[0][0] if self._ring else self.last + 1
        missed = max(0, first_kept - start - 1)
        ring = list(self._ring)  # numbered without gaps: the wanted ones start at an index
        wanted = ring[max(0, start + 1 - first_kept):]
        events, more, self._packed = await packed_page(
            wanted, _number, _render, limit, clock, self._packed, extra=SEQ_BYTES)
        seqs = list(range(wanted[0][0], wanted[0][0] + len(events))) if events else []
        return Spliced(epoch=self.epoch, events=Packed(events), seqs=seqs, missed=missed,
                       more=more, last=self.last)


def _number(item: tuple[int, JobEvent]) -> int:
    return item[0]


def _render(item: tuple[int, JobEvent]) -> dict[str, Any]:
    return item[1].to_dict()
