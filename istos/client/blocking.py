"""The client's async code run to its end on the calling thread, with no event loop.

A blocking caller whose transport never suspends (:class:`~istos.transport.zenoh_blocking.
BlockingQuerier`) and whose clock sleeps by blocking (:class:`BlockingClock`) can drive the
same coroutines the app awaits (the producer's checks, the client's keys, retries and typed
errors) with :func:`run_to_end`: one ``send`` runs them through. The :class:`~istos.
SyncProducer` does, so its calls are the async producer's code without a loop hop.
"""

from __future__ import annotations

import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from ..clock import SystemClock
from ..errors import IstosError

T = TypeVar("T")


class Suspended(IstosError):
    """A coroutine driven by :func:`run_to_end` waited on something (it needs a loop)."""


class BlockingClock(SystemClock):
    """The system clock whose ``sleep`` blocks the calling thread (a coroutine that never
    suspends), cut short when ``closing`` is set (the caller is shutting down)."""

    def __init__(self, closing: threading.Event) -> None:
        self.closing = closing

    async def sleep(self, seconds: float) -> None:
        self.closing.wait(max(0.0, seconds))


def run_to_end(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` within this call; its result or its exception. Raises :class:`Suspended`
    (and closes ``coro``) if it waited on a future: what it awaits must never suspend."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coro.close()
    raise Suspended("a blocking call waited on an event loop it does not run")
