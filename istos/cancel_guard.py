"""Deadlines that never swallow a cancellation: :func:`within`, the engine's one way to await
something with a time bound (``tests/test_seams.py`` checks that nothing else in ``istos/``
calls ``asyncio.wait_for``).

On Python 3.11, ``asyncio.wait_for`` returns the inner result when the inner awaitable ends in
the same loop iteration as the waiting Task is cancelled: the cancellation is lost, and a loop
the cancel was meant to end goes on (a relay, election or worker whose ``stop`` then waits for
it forever). ``asyncio.timeout`` (3.11+) has no such window: the deadline cancels the calling
Task itself, and no extra Task stands between the caller and what it awaits (which also saves
wait_for's Task, and the loop iteration its first step costs, per call).

Libraries can still swallow a cancel inside what is awaited: redis-py waits for every command
it sends with ``wait_for``. A Task counts the cancellations requested of it
(``Task.cancelling()``, Python 3.11+) and only ``uncancel()`` takes one back (as
``asyncio.timeout`` does for its own), so a call that returns with the count higher than when
it began was cancelled, and the cancellation was swallowed: :func:`within` raises it then.
Python 3.10 has neither ``asyncio.timeout`` nor the count: there :func:`within` is
``wait_for`` and the check does nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

# asyncio.timeout (3.11+): a deadline on the calling Task itself; None before 3.11.
_TIMEOUT: Callable[[float | None], Any] | None = getattr(asyncio, "timeout", None)


async def within(aw: Awaitable[T], timeout_s: float | None) -> T:
    """Await ``aw`` for at most ``timeout_s`` seconds of the loop's clock (None: no bound).

    Raises ``asyncio.TimeoutError`` when the time runs out (``aw`` is cancelled first), and
    ``asyncio.CancelledError`` when the calling Task is cancelled, even in the loop iteration
    in which ``aw`` ends and even if ``aw`` itself swallowed the cancel (Python 3.11+; on 3.10,
    ``asyncio.wait_for``'s own behaviour). A ``timeout_s`` of 0 or less never starts ``aw``
    unless it is already done, as ``wait_for``.

    The Task that awaits this must be the one that runs it to its end (a coroutine driven by
    hand must not start it in one Task's name and finish it in another's: the deadline cancels
    the Task that entered it). Outside any Task (a coroutine's first step driven by hand) it
    falls back to ``wait_for``, whose own Task then carries the deadline.
    """
    before = cancel_requests()
    if _TIMEOUT is not None and (timeout_s is None or timeout_s > 0) \
            and asyncio.current_task() is not None:
        async with _TIMEOUT(timeout_s):
            result = await aw
    else:
        result = await asyncio.wait_for(aw, timeout_s)
    reraise_swallowed(before)
    return result


def cancel_requests() -> int:
    """How many cancellations of the current Task are pending (0 outside a Task, and on
    Python 3.10). Read it before a call that may swallow one, for :func:`reraise_swallowed`."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return cancelling() if cancelling is not None else 0


def reraise_swallowed(before: int) -> None:
    """Raise ``asyncio.CancelledError`` if the current Task was cancelled since
    :func:`cancel_requests` returned ``before`` and nothing raised it (a swallowed cancel)."""
    if cancel_requests() > before:
        raise asyncio.CancelledError
