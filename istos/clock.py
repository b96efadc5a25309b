"""The Clock port: where the engine reads time and waits.

One concept at two layers: this is the port (and its live clock); the simulator's clocks
implementing it are ``istos_nb/sim/clock.py``.

The engine never calls ``time.time()`` or ``asyncio.sleep`` for its own timers; it asks the node's
clock. The simulator supplies a clock with skew and drift on virtual time.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """The port through which a node reads time and waits (``Istos(clock=...)``).

    :class:`SystemClock` is the live one; the simulator passes a virtual clock with its own
    skew and drift. An implementation's ``sleep`` must return after the given time on its own
    measure, and ``monotonic`` must never go back.
    """

    def now(self) -> float:
        """Wall-clock seconds since the epoch, as this node reads them."""

    def monotonic(self) -> float:
        """Seconds on a clock that never jumps (for measuring durations)."""

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` as this node measures them."""

    def to_loop_seconds(self, seconds: float) -> float:
        """Convert a duration on this clock to seconds of the event loop's timeline."""


class SystemClock:
    """The live clock, every node's default: ``now`` is ``time.time()``, ``monotonic`` is
    ``time.monotonic()`` and ``sleep`` is ``asyncio.sleep`` (a negative duration waits 0)."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def to_loop_seconds(self, seconds: float) -> float:
        return seconds


class ManualClock:
    """A wall clock that moves only when told (``clock.t = ...`` or :meth:`advance`).

    For tests and benchmarks that need exact wall-clock readings (TTLs, expiry) while the event
    loop keeps its own time: sleeps wait on the loop, not on this clock.
    """

    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def to_loop_seconds(self, seconds: float) -> float:
        return seconds
