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
import gc
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ... import protocol
from ...clock import Clock

T = TypeVar("T")

SLICE_S = 0.004  # the longest a read op works before it lets others in
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
        self._until = clock.monotonic() + SLICE_S
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


async def count_sliced(items: list[T], test: Callable[[T], bool], clock: Clock,
                       chunk: int = 1024) -> int:
    """How many of ``items`` pass ``test``, in slices."""
    slicer, found = Slicer(clock), 0
    for start in range(0, len(items), chunk):
        found += sum(1 for item in items[start:start + chunk] if test(item))
        await slicer.tick(CHECK_EVERY)
    return found


async def page_sliced(items: Iterable[T], render: Callable[[T], dict[str, Any]], limit: int,
                      clock: Clock, budget: int = protocol.PAGE_BUDGET,
                      ) -> tuple[list[dict[str, Any]], bool]:
    """:func:`protocol.page` in slices; ``items`` must not change while it runs (a list of
    records nobody changes once made, such as events: each is rendered twice).

    The walk only measures: each entry is rendered, sized and dropped, and the items that fit
    are rendered again in the last step (:func:`rendered`). 5,000 entries kept as dicts across
    the walk's yields would be promoted to the cyclic GC's oldest generation and set off full
    collections (rendering again costs less than decoding the sized bytes).
    """
    chosen: list[T] = []
    used = 0
    slicer = Slicer(clock)
    for item in items:
        if len(chosen) >= limit:
            return rendered(chosen, render), True
        size = protocol.encoded_size(render(item))
        if chosen and used + size > budget:
            return rendered(chosen, render), True
        chosen.append(item)
        used += size
        await slicer.tick()
    return rendered(chosen, render), False


def rendered(items: list[T], render: Callable[[T], dict[str, Any]]) -> list[dict[str, Any]]:
    """``render`` each item, in this step, with the cyclic GC held off while it runs.

    Thousands of fresh dicts in one step would set off young collections that find them all
    alive and promote them; once promoted objects pass a quarter of what the process holds,
    CPython runs a full collection, which walks every held record (tens of ms with 100k jobs).
    Held off, the page lives and dies (once its reply is encoded) as young garbage.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return [render(item) for item in items]
    finally:
        if enabled:
            gc.enable()
