"""Re-raise a cancellation that a library swallowed.

On Python 3.11, ``asyncio.wait_for`` returns the inner result when the inner awaitable ends in
the same loop iteration as the waiting Task is cancelled: the cancellation is lost, and a loop
the cancel was meant to end goes on (an HA election whose ``stop`` then waits for it forever).
redis-py waits that way for every command it sends; the SQL adapter and the election's
bounded renewal use ``wait_for`` too. A Task counts the cancellations requested of it
(``Task.cancelling()``, Python 3.11+) and only ``uncancel()`` takes one back (as
``asyncio.timeout`` does for its own), so a call that returns with the count higher than when
it began was cancelled, and the cancellation was swallowed. Python 3.10 has no such count:
there these checks do nothing.
"""

from __future__ import annotations

import asyncio


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
