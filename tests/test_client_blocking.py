"""The client's async code driven to its end with no event loop (the SyncProducer's way)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from istos.client.blocking import BlockingClock, Suspended, run_to_end
from istos.errors import InvalidJob


async def _answer() -> int:
    await BlockingClock(threading.Event()).sleep(0.0)  # blocks (for no time): never suspends
    return 42


async def _fails() -> None:
    raise InvalidJob("bad")


async def _waits_on_a_loop() -> None:
    await asyncio.sleep(0)  # a bare yield: it needs a loop to resume it


def test_run_to_end_returns_the_result_or_raises_the_error() -> None:
    assert run_to_end(_answer()) == 42
    with pytest.raises(InvalidJob, match="bad"):
        run_to_end(_fails())


def test_a_coroutine_that_suspends_is_refused_and_closed() -> None:
    coro = _waits_on_a_loop()
    with pytest.raises(Suspended):
        run_to_end(coro)
    assert coro.cr_frame is None  # closed: nothing left half-run


@pytest.mark.timeout(20)
def test_the_blocking_clock_is_cut_short_by_closing() -> None:
    closing = threading.Event()
    clock = BlockingClock(closing)
    closing.set()
    run_to_end(clock.sleep(3600.0))  # an hour, unless closing cuts it short (else: timeout)
