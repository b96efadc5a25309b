"""Per-node clocks on the simulation's timeline, with a fixed offset (skew) and a rate error
(drift). Skew and drift change what a node *reads*; the true timeline is the loop's time."""

from __future__ import annotations

import asyncio

SIM_EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: a fixed origin keeps runs reproducible


class SimClock:
    """``now() = epoch + skew + t * (1 + drift)`` where ``t`` is the true virtual time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, skew_s: float = 0.0,
                 drift_ppm: float = 0.0, epoch: float = SIM_EPOCH) -> None:
        self._loop = loop
        self.skew_s = float(skew_s)
        self.rate = 1.0 + float(drift_ppm) * 1e-6
        self.epoch = float(epoch)

    def now(self) -> float:
        return self.epoch + self.skew_s + self._loop.time() * self.rate

    def monotonic(self) -> float:
        return self._loop.time() * self.rate

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.rate)

    def to_loop_seconds(self, seconds: float) -> float:
        return seconds / self.rate

    def true_time(self, node_time: float) -> float:
        """The true virtual time at which this clock reads ``node_time``."""
        return (node_time - self.epoch - self.skew_s) / self.rate
