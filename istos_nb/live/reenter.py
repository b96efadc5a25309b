"""Wait for a result from another thread while keeping the caller's running event loop alive.

A plain (synchronous) ``LiveQueue`` call made inside a running loop — a Jupyter cell, code under
``asyncio.run`` — would block that loop until the reply comes. When the queue's owner is served
on that very loop (``await app.start()`` in the same notebook), the owner could then never
answer. :func:`wait_running_loop` instead runs the loop's ready callbacks, timers and I/O itself
while it waits, the way ``nest_asyncio`` re-enters a loop, but only for the duration of the call
and without patching asyncio globally (no Task/Future class swap, no new ``run``).

It relies on ``asyncio.BaseEventLoop`` internals that have been stable since Python 3.7
(``_ready``, ``_scheduled``, ``_selector``, ``_process_events``): :func:`can_reenter` says when
they are absent (uvloop, another loop class), and the caller then blocks as before.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import sys
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_MAX_SELECT_S = 0.05  # re-check the future and the deadline at least this often


def can_reenter(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether :func:`wait_running_loop` can drive ``loop`` (a stock asyncio selector loop)."""
    return isinstance(loop, asyncio.BaseEventLoop) and all(
        hasattr(loop, name) for name in ("_ready", "_scheduled", "_selector", "_process_events"))


def wait_running_loop(loop: asyncio.AbstractEventLoop, fut: concurrent.futures.Future[T],
                      timeout_s: float) -> T:
    """Return ``fut``'s result, running ``loop`` (the caller's, running on this thread) meanwhile.

    Raises ``concurrent.futures.TimeoutError`` after ``timeout_s`` (``fut`` is left to the
    caller), and whatever ``fut`` raised. Callbacks scheduled on ``loop`` run nested inside
    the caller's one, as under ``nest_asyncio``; a callback whose context is the caller's own
    (entered) context cannot run there and waits until the call returns.
    """
    base: Any = loop  # the private attributes below are not in the typeshed stubs
    ready = base._ready
    deferred: list[Any] = []
    # The loop that is running us popped its batch size before calling us: leave at least as
    # many handles in _ready as there were, or its next popleft() would hit an empty deque.
    owed = len(ready)
    fut.add_done_callback(lambda _f: _wake(loop))
    deadline = loop.time() + timeout_s
    try:
        while not fut.done():
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise concurrent.futures.TimeoutError
            _run_once(base, min(remaining, _MAX_SELECT_S), deferred)
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


def _run_once(loop: Any, max_wait_s: float, deferred: list[Any]) -> None:
    """One iteration of ``BaseEventLoop._run_once``, nested: poll I/O, move due timers, run
    what is ready, each with the caller's task stepped aside."""
    ready, scheduled = loop._ready, loop._scheduled
    while scheduled and scheduled[0]._cancelled:
        loop._timer_cancelled_count -= 1
        heapq.heappop(scheduled)._scheduled = False
    timeout = 0.0 if ready else max_wait_s
    if scheduled:
        timeout = min(timeout, max(0.0, scheduled[0]._when - loop.time()))
    loop._process_events(loop._selector.select(timeout))
    end_time = loop.time() + loop._clock_resolution
    while scheduled and scheduled[0]._when < end_time:
        handle = heapq.heappop(scheduled)
        handle._scheduled = False
        ready.append(handle)
    for _ in range(len(ready)):
        handle = ready.popleft()
        if handle._cancelled:
            continue
        context = getattr(handle, "_context", None)
        if context is not None and _entered(context):
            deferred.append(handle)  # e.g. ipykernel >= 7 runs each cell in one shared context
            continue
        _without_current_task(loop, handle._run)


def _entered(context: Any) -> bool:
    try:
        context.run(int)
    except RuntimeError:
        return True
    return False


def _without_current_task(loop: asyncio.AbstractEventLoop, run: Callable[[], None]) -> None:
    # A task stepped while the caller's task counts as current would raise "Cannot enter into
    # task ... while another task ... is being executed": step the caller's task aside.
    if sys.version_info >= (3, 14):
        swap = asyncio.tasks._swap_current_task  # type: ignore[attr-defined]
        current = swap(loop, None)
        try:
            run()
        finally:
            swap(loop, current)
        return
    tasks: dict[Any, Any] = asyncio.tasks._current_tasks  # type: ignore[attr-defined]
    current = tasks.pop(loop, None)
    try:
        run()
    finally:
        if current is not None:
            tasks[loop] = current
