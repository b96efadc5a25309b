"""Per-node clocks on the simulation's timeline, with an offset (skew) and a rate error
(drift). Skew and drift change what a node *reads*; the true timeline is the loop's time.

One concept at two layers: the port is ``istos/clock.py``; these are its simulated clocks.

Both can change during a run (the ``clock_skew`` and ``clock_drift`` faults): a step moves the
wall clock (``now``) only, as a stepped system clock leaves ``CLOCK_MONOTONIC`` alone; a new
rate bends both from that moment on, continuously."""

from __future__ import annotations

import asyncio

SIM_EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: a fixed origin keeps runs reproducible


class SimClock:
    """``now() = epoch + skew + monotonic()``, ``monotonic()`` advancing ``rate`` node seconds
    per true virtual second (``rate = 1 + drift_ppm / 1e6``)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, skew_s: float = 0.0,
                 drift_ppm: float = 0.0, epoch: float = SIM_EPOCH) -> None:
        self._loop = loop
        self.skew_s = float(skew_s)
        self.rate = 1.0 + float(drift_ppm) * 1e-6
        self.epoch = float(epoch)
        self._t0 = 0.0  # the true time of the last rate change, and the monotonic reading then
        self._mono0 = 0.0

    def now(self) -> float:
        return self.epoch + self.skew_s + self.monotonic()

    def monotonic(self) -> float:
        return self._mono0 + (self._loop.time() - self._t0) * self.rate

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.rate)

    def to_loop_seconds(self, seconds: float) -> float:
        return seconds / self.rate

    def true_time(self, node_time: float) -> float:
        """The true virtual time at which this clock reads ``node_time`` (at its present skew
        and rate)."""
        return self._t0 + (node_time - self.epoch - self.skew_s - self._mono0) / self.rate

    def step(self, seconds: float) -> None:
        """Move the wall clock ``seconds`` ahead (behind if negative) from now on."""
        self.skew_s += float(seconds)

    def set_rate(self, rate: float) -> None:
        """Run ``rate`` node seconds per true second from now on (> 0); readings stay
        continuous."""
        if rate <= 0:
            raise ValueError(f"a clock's rate must be > 0, got {rate}")
        self._mono0, self._t0 = self.monotonic(), self._loop.time()
        self.rate = float(rate)
