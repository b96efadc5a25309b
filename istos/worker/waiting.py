"""Prefetched jobs waiting for an execution slot: wait while their lease allows, else hand back.

A prefetched job waits in claim order for one of ``concurrency`` slots. Without heartbeats its
lease does not grow while it waits; if it would still be waiting when the lease ends (less a
margin for the message to arrive: a tenth of the lease, or four claim round trips if longer),
the worker hands it back with one batched ``release`` per loop turn, as it does at shutdown:
ready again at once and its attempt not counted, so a job that never started never uses an
attempt (with ``max_attempts=1`` it would otherwise be dead-lettered without having run). A
heartbeat that renews the lease while the job waits extends the wait. If the release cannot
reach the owner in time, the lease expires and the attempt counts, as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

from .. import protocol
from ..cancel_guard import within
from ..clock import Clock


class Waiting(Protocol):
    """What is waited for: the job's lease end as the worker can be sure of it
    (:class:`~istos.worker.heartbeat.Held`)."""

    @property
    def expires(self) -> float: ...


MIN_WAIT_S = 1e-3
"""Less time than this left before the hand-back point: hand the job back now."""


class WaitingJobs:
    """Built by the worker with what it needs of it (so neither module imports the other):
    the slots, the node's clock, the lease and claim round trip as they are now, how to send
    a ``release`` and where to keep the task that sends it."""

    def __init__(self, slots: asyncio.Semaphore, clock: Clock, *,
                 lease_s: Callable[[], float | None], claim_rtt: Callable[[], float | None],
                 send_release: Callable[[list[dict[str, Any]]], Coroutine[Any, Any, None]],
                 tasks: set[asyncio.Task[None]]) -> None:
        self.slots, self.clock = slots, clock
        self._lease_s, self._claim_rtt = lease_s, claim_rtt
        self._send_release, self._tasks = send_release, tasks
        self._handback: list[dict[str, Any]] = []

    async def take_slot(self, held: Waiting) -> bool:
        """Acquire an execution slot; False (no slot taken) when the job's lease would end
        first, less :meth:`margin`."""
        slots = self.slots
        if not slots.locked():
            await slots.acquire()
            return True
        clock = self.clock
        while True:
            left = held.expires - self.margin() - clock.monotonic()
            if left <= MIN_WAIT_S:  # (a floor: float rounding never makes it spin in place)
                return False
            try:
                await within(slots.acquire(), clock.to_loop_seconds(left))
                return True
            except asyncio.TimeoutError:
                continue  # look again: a renewal may have moved the lease's end

    def margin(self) -> float:
        """How long before its lease ends a waiting job is handed back."""
        return max((self._lease_s() or 0.0) / 10, 4 * (self._claim_rtt() or 0.0))

    def hand_back(self, job_id: str, token: str) -> None:
        """Queue an unstarted job for one batched ``release`` at the end of this loop turn."""
        self._handback.append({"job_id": job_id, "token": token})
        if len(self._handback) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        items, self._handback = self._handback, []
        for start in range(0, len(items), protocol.MAX_RELEASES):
            task = asyncio.get_running_loop().create_task(
                self._send_release(items[start:start + protocol.MAX_RELEASES]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
