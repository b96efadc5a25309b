"""Read ops that walk many records share the loop: they work in slices of a few milliseconds.

An owner serves claims and acks on the same event loop as its read ops. A read that walks
100k records (``jobs`` at a large offset, ``why``'s count of the jobs ahead, ``resolve``, a page
of 5,000 events) would hold the loop for tens of milliseconds, and every claim waiting behind
it with it. So such walks go over a *snapshot* (a list: the records may change while the walk
yields) and hand the loop over every :data:`SLICE_S` of work: ``asyncio.sleep(0)`` yields the
loop, and a zero ``time.sleep`` hands the GIL to the mesh's receiving thread, which needs it to
queue other requests' callbacks (otherwise it waits a whole GIL switch interval).

The time comes from the node's clock: under a virtual clock a walk never yields, so
simulations stay exact.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from ... import codec, protocol
from ...clock import Clock

T = TypeVar("T")

SLICE_S = 0.004  # the longest a read op works before it lets others in
FIRST_SLICE_S = 0.0002  # ...in its first step, which may share a loop step with others (below)
CHECK_EVERY = 64  # items between two looks at the clock


async def pause() -> None:
    """Let other requests in: the GIL to the mesh's thread, then the loop."""
    # Yields, not waits (no time passes on any clock), so no Clock is involved.
    time.sleep(0)
    await asyncio.sleep(0)


class Slicer:
    """Counts work and yields once a slice's time is spent (see the module docstring)."""

    __slots__ = ("_clock", "_until", "_n")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        # The first slice is short: the transport runs each request's first step eagerly, in
        # the loop step that took it in, so a burst of reads would run their first slices
        # back to back in one step (two 4 ms slices: an 8 ms stall). For the same reason a
        # read that copies a snapshot of 100k records first yields once (`pause`), so the
        # copy (a few ms) has a step of its own.
        self._until = clock.monotonic() + FIRST_SLICE_S
        self._n = 0

    async def tick(self, items: int = 1) -> None:
        """Count ``items`` of work done; yield if the slice is spent."""
        self._n += items
        if self._n < CHECK_EVERY:
            return
        self._n = 0
        if self._clock.monotonic() >= self._until:
            await pause()
            self._until = self._clock.monotonic() + SLICE_S


async def packed_page(items: Iterable[T], number: Callable[[T], int],
                      render: Callable[[T], dict[str, Any]], limit: int, clock: Clock,
                      cache: Mapping[int, bytes], budget: int = protocol.PAGE_BUDGET,
                      extra: int = 0) -> tuple[list[bytes], bool, dict[int, bytes]]:
    """:func:`protocol.page` in slices, each entry encoded as it is met: ``(entries, more,
    packed)``, the entries' msgpack bytes (for a :class:`codec.Packed` reply value, spliced as
    they are when the reply is encoded) and whether more items remain.

    ``items`` must not change while it runs (a snapshot), and each must be immutable and named
    by ``number`` (an event's sequence number): ``cache`` holds entries packed before, by
    number, and ``packed`` the ones of this page, for the caller to keep as the next read's
    cache (a reader asking again finds them all). ``extra`` bytes are counted per entry beside
    its own (a sequence number sent in another list).

    Only bytes are kept across the walk's yields: 5,000 entries kept as dicts would be promoted
    to the cyclic GC's oldest generation and set off full collections (each walks every held
    record: tens of ms with 100k jobs), and rendering them all in one last step held the loop
    for about 10 ms.
    """
    out: list[bytes] = []
    packed: dict[int, bytes] = {}
    used = 0
    slicer = Slicer(clock)
    for item in items:
        if len(out) >= limit:
            return out, True, packed
        n = number(item)
        entry = cache.get(n)
        if entry is None:
            entry = codec.encode_message(render(item))
        size = len(entry) + extra
        if out and used + size > budget:
            return out, True, packed
        out.append(entry)
        packed[n] = entry
        used += size
        await slicer.tick()
    return out, False, packed
