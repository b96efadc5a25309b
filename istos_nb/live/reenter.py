"""Wait for a result from another thread while keeping the caller's running event loop alive.

A plain (synchronous) ``LiveQueue`` call made inside a running loop — a Jupyter cell, code under
``asyncio.run`` — would block that loop until the reply comes. When the queue's owner is served
on that very loop (``await app.start()`` in the same notebook), the owner could then never
answer. :func:`wait_running_loop` instead runs the loop's ready callbacks, timers and I/O itself
while it waits, the way ``nest_asyncio`` re-enters a loop, but only for the duration of the call
and without patching asyncio globally (no Task/Future class swap, no new ``run``).

It relies on ``asyncio.BaseEventLoop`` internals that have been stable since Python 3.7
(``_ready``, ``_scheduled``, ``_selector``, ``_process_events``), all reached through
:mod:`istos_nb.asyncio_internals`: :func:`can_reenter` says when they are absent (uvloop,
another loop class), and the caller then blocks as before.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any, TypeVar

from ..asyncio_internals import can_reenter, ready_queue, run_nested_once

__all__ = ["can_reenter", "wait_running_loop"]

T = TypeVar("T")

_MAX_SELECT_S = 0.05  # re-check the future and the deadline at least this often


def wait_running_loop(loop: asyncio.AbstractEventLoop, fut: concurrent.futures.Future[T],
                      timeout_s: float) -> T:
    """Return ``fut``'s result, running ``loop`` (the caller's, running on this thread) meanwhile.

    Raises ``concurrent.futures.TimeoutError`` after ``timeout_s`` (``fut`` is left to the
    caller), and whatever ``fut`` raised. Callbacks scheduled on ``loop`` run nested inside
    the caller's one, as under ``nest_asyncio``; a callback whose context is the caller's own
    (entered) context cannot run there and waits until the call returns.
    """
    ready = ready_queue(loop)
    deferred: list[Any] = []
    # The loop that is running us popped its batch size before calling us: leave at least as
    # many handles in the ready queue as there were, or its next popleft() would hit an empty
    # deque.
    owed = len(ready)
    fut.add_done_callback(lambda _f: _wake(loop))
    deadline = loop.time() + timeout_s
    try:
        while not fut.done():
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise concurrent.futures.TimeoutError
            run_nested_once(loop, min(remaining, _MAX_SELECT_S), deferred)
    finally:
        ready.extendleft(reversed(deferred))
        while len(ready) < owed:
            ready.append(asyncio.Handle(_nothing, (), loop))
    return fut.result()


def _nothing() -> None:
    return None


def _wake(loop: asyncio.AbstractEventLoop) -> None:
    """Interrupt the nested ``select()`` (from the thread that completed the future)."""
    try:
        loop.call_soon_threadsafe(_nothing)
    except RuntimeError:  # the caller gave up and its loop closed since: nobody to wake
        pass
