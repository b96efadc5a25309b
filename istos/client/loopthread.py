"""A private asyncio loop in a daemon thread: how blocking callers use the async client.

The :class:`~istos.SyncProducer` and ``istos_nb``'s ``LiveQueue`` each own one; their session
lives on it and every request runs there, through the same :mod:`istos.client` code the app's
async producer uses. :meth:`LoopThread.run` submits a coroutine and waits for it with a bound.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from ..cancel_guard import within

T = TypeVar("T")


class LoopThread:
    """A private asyncio loop in a daemon thread; :meth:`run` submits and waits with a bound."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            # Whatever is still scheduled belongs to a closed owner of this loop: cancel it.
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.close()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def on_loop_thread(self) -> bool:
        return threading.get_ident() == self._thread.ident

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run ``coro`` on the loop and wait at most ``timeout_s`` (then
        ``concurrent.futures.TimeoutError``); cancel it if the caller stops waiting."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result(timeout_s)
        except BaseException:
            fut.cancel()
            raise

    async def arun(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run ``coro`` on the loop and await it from the caller's loop, at most ``timeout_s``
        (``asyncio.TimeoutError`` then); cancelling the caller cancels ``coro``."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return await within(asyncio.wrap_future(fut), timeout_s)
        except BaseException:
            fut.cancel()
            raise

    def stop(self, timeout_s: float) -> None:
        """Stop the loop (its tasks are cancelled) and wait up to ``timeout_s`` for the thread."""
        if self.alive:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout_s)
