"""A queue's pauses, stored like its jobs: written to storage first, then applied to memory.

``pause`` and ``resume`` (the whole queue, or one fairness group) each write one key of the
namespace ``pause:{queue}`` (:func:`~istos.core.pauses.pause_key`) through the owner's storage
view, which carries an HA leader's fence: a leader that lost its epoch cannot pause or resume.
Only once the write succeeded does the claim path see the change, and an outage leaves the
queue as storage holds it (the caller gets ``StorageUnavailable``). At start-up the owner
loads them (:meth:`PauseStore.load`), so a restarted owner or a newly elected leader keeps
serving a paused queue paused. With storage that is not durable they live in memory only, as
that owner's jobs do.

Pause writes of one queue are serialised by a lock local to this owner (an ``asyncio.Lock``,
no storage lock): two admins racing pause and resume end with storage and memory agreeing on
the later one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ... import events as ev
from ...clock import Clock
from ...core.pauses import Pause, Pauses, pause_key
from ...core.state import READY, QueueState
from ...errors import CapacityExceeded
from ...events import EventKind, JobEvent
from ...protocol import MAX_PAUSED_GROUPS
from ...storage.base import Storage

log = logging.getLogger("istos.owner")


def pause_ns(queue: str) -> str:
    """The storage namespace of ``queue``'s pauses."""
    return f"pause:{queue}"


@dataclass(frozen=True)
class PauseHooks:
    """What the store needs of its owner besides storage: emit an event, wake workers."""

    emit: Callable[[JobEvent], None]
    nudge: Callable[[int], None]


class PauseStore:
    """One queue's pauses (see the module doc)."""

    def __init__(self, queue: str, node_id: str, state: QueueState, storage: Storage, *,
                 durable: bool, clock: Clock, hooks: PauseHooks) -> None:
        self.queue = queue
        self.node_id = node_id
        self.state = state
        self.storage = storage
        self.durable = durable
        self.clock = clock
        self.hooks = hooks
        self.ns = pause_ns(queue)
        self.pauses = Pauses(state.heaps.paused_groups)
        self._lock = asyncio.Lock()

    async def load(self) -> None:
        """Apply the stored pauses (durable storage; a damaged entry is logged and skipped)."""
        if not self.durable:
            return
        for key, raw in await self.storage.scan(self.ns):
            pause = Pause.decode(raw)
            if pause is None or pause_key(pause.group) != key:
                log.warning("queue %s: stored pause %r is damaged; ignored", self.queue, key)
                continue
            self.pauses.put(pause)
        self.state.paused = self.pauses.queue is not None

    def get(self, group: str | None = None) -> Pause | None:
        """The pause of ``group`` (None: the whole queue's), if it is paused."""
        return self.pauses.get(group)

    async def pause(self, *, by: str | None, reason: str | None,
                    group: str | None) -> Pause:
        """Pause the queue (``group`` None) or one group: stored, then applied. Pausing what
        is paused already replaces who and why (the time stays the first pause's).

        Raises CapacityExceeded past ``MAX_PAUSED_GROUPS`` paused groups, StorageUnavailable
        (FencedOut for a leader that lost its epoch) when the write fails: nothing changed.
        """
        async with self._lock:
            was = self.pauses.get(group)
            if group is not None and was is None and \
                    len(self.pauses.by_group) >= MAX_PAUSED_GROUPS:
                raise CapacityExceeded(f"queue {self.queue!r} has {MAX_PAUSED_GROUPS} paused "
                                       "groups, the most it keeps; resume some first")
            at = self.clock.now() if was is None else was.at
            pause = Pause(at, by, reason, group)
            if self.durable:
                await self.storage.apply(self.ns, [(pause_key(group), pause.encode())], [])
            self.pauses.put(pause)
            if group is None:
                self.state.paused = True
            self._event(ev.PAUSED, pause)
            return pause

    async def resume(self, *, group: str | None) -> Pause | None:
        """Lift the pause of the queue (``group`` None) or of one group: the storage entry is
        deleted, then claims see it and idle workers are nudged. Returns the pause lifted
        (None: it was not paused, and nothing was written). Raises StorageUnavailable as
        :meth:`pause` does."""
        async with self._lock:
            was = self.pauses.get(group)
            if was is None:
                return None
            if self.durable:
                await self.storage.apply(self.ns, [], [pause_key(group)])
            self.pauses.drop(group)
            if group is None:
                self.state.paused = False
            self._event(ev.RESUMED, was)
            if not self.state.paused:
                self.hooks.nudge(max(1, self.state.counts[READY]))
            return was

    def stats(self) -> dict[str, Any]:
        """The fields ``stats`` adds (:meth:`~istos.core.pauses.Pauses.stats`)."""
        return self.pauses.stats()

    def _event(self, kind: EventKind, pause: Pause) -> None:
        self.hooks.emit(JobEvent(self.clock.now(), self.node_id, self.queue, "", kind, 0, None,
                                 {"by": pause.by, "reason": pause.reason, "group": pause.group}))
