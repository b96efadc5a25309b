"""The owner's write path: write, then apply, as one object every op handler receives.

A handler changes the pure :class:`~istos.core.state.QueueState`, then calls :meth:`commit`:
with durable storage the changed records are written through (group commit, ``persist.py``)
before the request is answered and before their events are published; a failed write puts
memory back as storage holds it (``rollback``) and the request gets ``StorageUnavailable``.
New jobs go the other way round (:meth:`store_new`): stored first, inserted into memory only
once the write succeeded, so nothing half-accepted stays behind an outage.

``generation`` is bumped by every rollback: a handler that read it before it awaited (a
piggybacked settle, a workflow hook) passes it to :meth:`commit`, which refuses to answer ok
when a rollback happened meanwhile (the changes the request saw may be gone).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ...core.state import Change, JobRecord, QueueState, Snapshot
from ...errors import FencedOut, StorageUnavailable
from ...events import JobEvent
from ...storage.base import TxStep
from .persist import Persister

log = logging.getLogger("istos.owner")


@dataclass(frozen=True)
class OwnerSignals:
    """What the write path tells the owner, which only the owner acts on."""

    publish: Callable[[list[JobEvent]], None]  # stored (or volatile) changes' events
    deadline_changed: Callable[[], None]  # a deadline may have come sooner: check the sweeper
    wake_sweeper: Callable[[], None]  # restored leases may be due: sweep now
    write_failed: Callable[[], None]  # a write failed (the owner notes when)
    fenced: Callable[[], None]  # the fence refused a write: stop serving at once


class WritePath:
    """One queue's write path (see the module doc): the owner builds it with its
    :class:`OwnerSignals` and hands it to its handlers."""

    def __init__(self, name: str, state: QueueState, persister: Persister, *, durable: bool,
                 signals: OwnerSignals) -> None:
        self.name = name
        self.state = state
        self.persister = persister
        self.durable = durable
        self._publish = signals.publish
        self._deadline_changed = signals.deadline_changed
        self._wake_sweeper = signals.wake_sweeper
        self._write_failed = signals.write_failed
        self._fenced = signals.fenced
        self._generation = 0
        # Ids whose record is being written right now (a duplicate enqueue waits on it).
        self._pending: dict[str, asyncio.Future[str]] = {}
        persister.on_failure = self.rolled_back

    @property
    def generation(self) -> int:
        """Bumped by every rollback (see the module doc)."""
        return self._generation

    async def commit(self, generation: int | None = None) -> None:
        """Write the last change's records through to storage, then publish its events.

        ``generation``: :attr:`generation` when the request began; if a rollback happened
        since, the request fails rather than reply ok. Raises StorageUnavailable (memory
        already rolled back) when the write fails.
        """
        state = self.state
        if not self.durable:
            self._publish(state.drain()[1])
            self._deadline_changed()
            return
        if generation is not None and generation != self._generation:
            self.roll_back(state.take_undo())
            raise StorageUnavailable(f"queue {self.name!r}: a storage write failed while this "
                                     "request ran; nothing it changed was kept")
        dirty, events = state.drain()
        await self.persister.write(dirty, state.take_undo())
        self._publish(events)
        self.after_change()

    def after_change(self) -> None:
        """Publish what a change outside a commit left (a duplicate enqueue's event) and tell
        the sweeper when a deadline came sooner."""
        dirty, events = self.state.drain()
        if self.durable and dirty:
            # Changes outside a request (none at present): written in the background.
            asyncio.get_running_loop().create_task(
                self.write_quietly(dirty, events, self.state.take_undo()))
        else:
            self._publish(events)
        self._deadline_changed()

    async def write_quietly(self, dirty: list[Change], events: list[JobEvent],
                            undo: dict[str, Snapshot]) -> bool:
        """A write nobody waits on (the sweeper's): False, logged and rolled back, on failure."""
        try:
            await self.persister.write(dirty, undo)
        except StorageUnavailable as exc:
            log.warning("queue %s: background write failed: %s", self.name, exc)
            return False
        self._publish(events)
        return True

    def pending(self, job_id: str) -> asyncio.Future[str] | None:
        """The write in flight of a new job with this id, if any."""
        return self._pending.get(job_id)

    async def wait_pending(self, job_ids: Iterable[str]) -> None:
        """Wait until no write of a new job with one of these ids is in flight (each one's
        outcome, stored or failed, then decides what a re-check of the queue finds)."""
        ids = list(job_ids)
        while True:
            waits = {self._pending[j] for j in ids if j in self._pending}
            if not waits:
                return
            await asyncio.gather(*waits, return_exceptions=True)

    async def store_new(self, new: dict[str, JobRecord], now: Callable[[], float], *,
                        also: Sequence[TxStep] = ()) -> None:
        """Store new jobs' records, then insert them into the queue (``now()`` read after the
        write); on failure raise StorageUnavailable with nothing inserted. ``also``: SQL
        statements that commit in the same transaction (see ``Persister.write``)."""
        loop = asyncio.get_running_loop()
        futs: dict[str, asyncio.Future[str]] = {jid: loop.create_future() for jid in new}
        self._pending.update(futs)
        try:
            await self.persister.write(list(new.values()), also=also)
        except StorageUnavailable as exc:
            for fut in futs.values():
                fut.set_exception(exc)
                fut.exception()  # retrieved: waiters re-raise or re-check themselves
            raise
        finally:
            for jid in futs:
                self._pending.pop(jid, None)
        at = now()
        for rec in new.values():
            self.state.insert(rec, at)
        for jid, fut in futs.items():
            fut.set_result(jid)
        self.after_change()

    def rolled_back(self, undo: dict[str, Snapshot], exc: StorageUnavailable) -> None:
        """The persister's failure hook: memory goes back to what storage holds."""
        self._write_failed()
        log.warning("queue %s: write failed, %d job(s) rolled back: %s", self.name, len(undo),
                    exc)
        for job_id, snap in self.state.take_undo().items():  # changes not yet handed over
            undo.setdefault(job_id, snap)
        self.roll_back(undo)
        if isinstance(exc, FencedOut):
            self._fenced()

    def roll_back(self, undo: dict[str, Snapshot]) -> None:
        self._generation += 1
        self.state.rollback(undo)
        self._wake_sweeper()  # restored leases may be due
