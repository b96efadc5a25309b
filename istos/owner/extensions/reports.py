"""Reports one owner sends another owner at least once: the queue both batches (a member's end
to its batch's home) and dependencies (a parent's end to each waiting child's owner) use.

A report is noted under a key; noting a key again replaces its report (the newer outcome is the
one to send). One task sends the noted reports in the order they were first noted, one at a
time; a send that fails with an :class:`~istos.errors.IstosError` is retried after a backoff
that doubles from :data:`RETRY_MIN_S` to :data:`RETRY_MAX_S` (owner clock) and starts again at
the minimum after a send succeeds. The receiver must be idempotent: a report whose answer was
lost is sent again. The task ends when the queue is empty or the owner stops.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Generic, TypeVar

from ...errors import IstosError

if TYPE_CHECKING:
    from ..handle import OwnerHandle

RETRY_MIN_S, RETRY_MAX_S = 0.5, 30.0  # backoff of a report whose send failed

K = TypeVar("K")
R = TypeVar("R")


class ReportQueue(Generic[K, R]):
    """Reports (``R``) by key (``K``), sent with ``send(key, report)`` until each succeeds.

    ``deferred(key, report, error)`` is called (to log) for every send that failed and will be
    retried. ``send`` raising anything but an ``IstosError`` ends the sending task (as any bug
    would); the report stays noted and is sent by the next task :meth:`note` starts.
    """

    def __init__(self, owner: OwnerHandle, send: Callable[[K, R], Awaitable[None]],
                 deferred: Callable[[K, R, IstosError], None]) -> None:
        self.owner = owner
        self._send, self._deferred = send, deferred
        self._pending: dict[K, R] = {}
        self._task: asyncio.Task[None] | None = None

    def note(self, key: K, report: R) -> None:
        """Note ``report`` under ``key`` (replacing any noted there) without starting a send."""
        self._pending[key] = report

    def start(self) -> None:
        """Start the sending task unless one runs (call after :meth:`note`, in a running loop)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._send_all())

    def __len__(self) -> int:
        return len(self._pending)

    async def _send_all(self) -> None:
        delay = RETRY_MIN_S
        while self._pending and self.owner.running:
            key, report = next(iter(self._pending.items()))
            try:
                await self._send(key, report)
            except IstosError as exc:
                self._deferred(key, report, exc)
                await self.owner.node.clock.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            delay = RETRY_MIN_S
            if self._pending.get(key) == report:  # (not replaced while it was being sent)
                del self._pending[key]

    def cancel(self) -> None:
        """Cancel the sending task (the owner stops). Reports still noted stay unsent: a
        restarted owner notes them again from what it stored."""
        if self._task is not None:
            self._task.cancel()
