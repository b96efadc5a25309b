"""A cheap "wake me, or time out" primitive for the engine's timer loops.

``asyncio.wait_for(event.wait(), t)`` allocates a Task per wait; the owner's sweeper and every
worker's dispatcher wait this way thousands of times, so they use a bare future and one timer.
"""

from __future__ import annotations

import asyncio


class Wakeup:
    def __init__(self) -> None:
        self._pending = False
        self._waiter: asyncio.Future[bool] | None = None

    def set(self) -> None:
        """Wake the current waiter, or make the next wait return at once."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(True)
        else:
            self._pending = True

    def clear(self) -> None:
        self._pending = False

    def is_set(self) -> bool:
        return self._pending

    async def wait(self, timeout: float | None) -> bool:
        """True if woken, False if ``timeout`` (loop seconds; None = forever) elapsed first."""
        if self._pending:
            self._pending = False
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        timer = None if timeout is None else loop.call_later(max(0.0, timeout), _expire, waiter)
        self._waiter = waiter
        try:
            return await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()


def _expire(waiter: asyncio.Future[bool]) -> None:
    if not waiter.done():
        waiter.set_result(False)
