"""The Clock contract (``tests/clock_contract.py``) on every clock, plus what each adds.

- :class:`~istos.clock.SystemClock` and :class:`~istos.clock.ManualClock` on the real loop;
- the simulator's node clock (:class:`~istos_nb.sim.clock.SimClock`) with skew and drift on the
  virtual loop, where its readings are exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from clock_contract import ClockContract
from virtual import on_virtual_loop

from istos.clock import Clock, ManualClock, SystemClock
from istos_nb.sim.clock import SIM_EPOCH, SimClock

pytestmark = pytest.mark.fast  # `make check`: no process, server or session


class TestSystemClock(ClockContract):
    @pytest.fixture
    def make_clock(self) -> Callable[[], Clock]:
        return SystemClock


class TestManualClock(ClockContract):
    follows_loop = False

    @pytest.fixture
    def make_clock(self) -> Callable[[], Clock]:
        return ManualClock

    async def test_moves_only_when_told(self) -> None:
        clock = ManualClock(1_800_000_000.0)
        await clock.sleep(0.01)
        assert clock.now() == clock.monotonic() == 1_800_000_000.0
        clock.advance(2.5)
        assert clock.now() == clock.monotonic() == 1_800_000_002.5
        clock.t = 1_800_000_010.0
        assert clock.now() == 1_800_000_010.0


@on_virtual_loop
class TestSimClock(ClockContract):
    @pytest.fixture
    def make_clock(self) -> Callable[[], Clock]:
        return lambda: SimClock(asyncio.get_running_loop(), skew_s=-3.0, drift_ppm=200.0)

    async def test_readings_are_exact_skewed_and_drifted_virtual_time(self) -> None:
        loop = asyncio.get_running_loop()
        clock = SimClock(loop, skew_s=10.0, drift_ppm=-500.0)
        start = loop.time()
        await clock.sleep(100.0)  # 100 s as the node measures them
        assert clock.monotonic() == pytest.approx(start * clock.rate + 100.0, abs=1e-9)
        assert loop.time() - start == pytest.approx(100.0 / (1 - 500e-6), abs=1e-9)
        assert clock.now() == pytest.approx(SIM_EPOCH + 10.0 + loop.time() * clock.rate)
        assert clock.true_time(clock.now()) == pytest.approx(loop.time(), abs=1e-6)
