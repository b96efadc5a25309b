"""The behaviour every Clock must share, as a reusable pytest base class.

Subclass :class:`ClockContract` in a ``Test*`` class and provide a synchronous fixture
``make_clock``: a callable returning a new clock, called inside the test on the loop the test runs
on (a simulator clock reads that loop). Set ``follows_loop = False`` for a clock whose readings do
not move with the loop's time (:class:`~istos.clock.ManualClock`); its sleeps still wait on it.

Sleeps here are short: the real-loop variants pay them in wall time.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from istos.clock import Clock

#: asyncio may run a timer up to its clock resolution early; readings are floats
EPS = 1e-6
SHORT_S = 0.03


class ClockContract:
    """Subclass with a ``make_clock`` fixture; see the module docstring."""

    follows_loop = True

    async def test_satisfies_protocol(self, make_clock: Callable[[], Clock]) -> None:
        assert isinstance(make_clock(), Clock)

    async def test_now_is_seconds_since_the_epoch(self, make_clock: Callable[[], Clock]) -> None:
        now = make_clock().now()
        assert isinstance(now, float) and math.isfinite(now)
        assert now > 1_600_000_000.0  # after 2020: seconds, not milliseconds or loop time

    async def test_monotonic_never_decreases(self, make_clock: Callable[[], Clock]) -> None:
        clock = make_clock()
        readings = [clock.monotonic()]
        for i in range(200):
            await clock.sleep(0.0 if i % 2 else 0.0001)
            readings.append(clock.monotonic())
        assert readings == sorted(readings)

    async def test_sleep_wakes_at_or_after_its_deadline(
            self, make_clock: Callable[[], Clock]) -> None:
        clock = make_clock()
        loop = asyncio.get_running_loop()
        for seconds in (SHORT_S, 2 * SHORT_S):
            t0, m0 = loop.time(), clock.monotonic()
            await clock.sleep(seconds)
            assert loop.time() - t0 >= clock.to_loop_seconds(seconds) - EPS
            if self.follows_loop:
                assert clock.monotonic() - m0 >= seconds - EPS

    async def test_sleeps_wake_in_deadline_order(self, make_clock: Callable[[], Clock]) -> None:
        clock = make_clock()
        woke: list[int] = []

        async def nap(i: int, seconds: float) -> None:
            await clock.sleep(seconds)
            woke.append(i)

        await asyncio.gather(nap(0, 3 * SHORT_S), nap(1, SHORT_S), nap(2, 2 * SHORT_S))
        assert woke == [1, 2, 0]

    async def test_zero_and_negative_sleeps_return_but_yield(
            self, make_clock: Callable[[], Clock]) -> None:
        clock = make_clock()
        loop = asyncio.get_running_loop()
        ran: list[float] = []
        loop.call_soon(ran.append, 1.0)
        await clock.sleep(0)
        await clock.sleep(-5)
        assert ran == [1.0]  # the sleeps let the loop run what was ready

    async def test_cancelled_sleep_raises_cancelled(self, make_clock: Callable[[], Clock]) -> None:
        clock = make_clock()
        task = asyncio.ensure_future(clock.sleep(3600))
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        assert task.cancelled()

    async def test_to_loop_seconds_is_a_positive_linear_scale(
            self, make_clock: Callable[[], Clock]) -> None:
        clock = make_clock()
        assert clock.to_loop_seconds(0.0) == 0.0
        one = clock.to_loop_seconds(1.0)
        assert 0.5 < one < 2.0
        assert math.isclose(clock.to_loop_seconds(250.0), 250.0 * one, rel_tol=1e-12)
