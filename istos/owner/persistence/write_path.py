"""The owner's write path: every write an owner makes, and the rule that no reply, and no
read, reports a state storage does not hold.

**Job changes.** A handler changes the pure :class:`~istos.core.state.QueueState`, then calls
:meth:`commit`: with durable storage the changed records are written through (group commit,
``persist.py``) before the request is answered and before their events are published; a
failed write puts memory back as storage holds it (``rollback``) and the request gets
``StorageUnavailable``. New jobs go the other way round (:meth:`store_new`): stored first,
inserted into memory only once the write succeeded, so nothing half-accepted stays behind an
outage.

**Reads: the read fence.** Between a change and the end of its write, memory is ahead of
storage, and a read computed from memory could report a change that is then rolled back. The
rule: *a read answers only with what storage holds*. The owner serves every read op (an op on
the ``read`` role key: ``result``, ``why``, ``stats``, ``jobs``, ``dead``, ...; not those of
:data:`UNFENCED_READS`) through :meth:`read`, which computes the answer from memory and then,
before the reply leaves, waits until every change the answer could have seen is durable. Each
hand-over of changes to the persister takes the next number of an applied sequence
(:attr:`applied_seq`); :attr:`durable_seq` follows the writes that ended. A read notes the
number it saw (one more if memory holds changes not yet handed over: the next hand-over takes
them all) and waits for :meth:`durable_through`. If a rollback happened meanwhile
(:attr:`generation` moved), what it computed may be gone: it computes again, once; if a
rollback comes again, it answers ``StorageUnavailable``. Each wait is bounded by the storage's
own request timeout (:func:`~istos.storage.base.request_timeout_s`): a write that has not
ended by then (a frozen store whose client never gives up) makes the read answer
``StorageUnavailable`` naming the queue, while the write goes on. On an idle queue (nothing
in flight) and on a volatile one a read waits for nothing; under a steady stream of writes it
waits for up to two group commits (the one in flight, and the one that takes the changes it
saw).
Every other op is served through :meth:`change`, which hands over any change a failed request
left in memory once no such request is in flight, so a read never waits on a write nobody
makes.

**Other owner writes.** Everything else an owner stores (chord reservations and barriers,
batch records, dependency watches, schedule slot marks, pauses) goes through :meth:`apply_aux`
(:meth:`put_aux`, :meth:`delete_aux`): written first, with an HA leader's fence, and its memory
changed only after the write succeeded (each caller's rule; a fired chord's tombstone is the
one stated exception, ``features/workflow.py``); a write the fence refused stops the owner at
once, as for job writes. These records are not job state, so they take no sequence number.

``generation`` is bumped by every rollback: a handler that read it before it awaited (a
piggybacked settle, a workflow hook) passes it to :meth:`commit`, which refuses to answer ok
when a rollback happened meanwhile (the changes the request saw may be gone).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ...clock import Clock
from ...core.state import Change, JobRecord, QueueState, Snapshot
from ...errors import FencedOut, StorageUnavailable
from ...events import JobEvent
from ...storage.base import Storage, TxStep
from ..extension import Handler
from .persist import Persister

log = logging.getLogger("istos.owner")

UNFENCED_READS = frozenset({"ping", "events", "follow", "events_since"})
"""Read ops served without the read fence: they report events, and an event is published only
once its change is stored (or they report no queue state at all: ``ping``, ``follow``'s key).
``follow`` and ``events_since`` may wait for events: fencing them would make a rollback
during the wait start the wait again."""


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
                 signals: OwnerSignals, aux: Storage, clock: Clock,
                 read_wait_s: float) -> None:
        """``aux``: the storage the owner's other records go to (:meth:`apply_aux`): for an
        HA leader, the view that carries its fence (``storage.base.FencedStorage``).
        ``read_wait_s``: how long (``clock`` seconds) a read waits for a write before it
        answers StorageUnavailable (the storage's request timeout)."""
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
        self._aux = aux
        # The read fence (module doc): hand-overs to the persister numbered in order, and the
        # highest number whose write ended (stored, or failed and rolled back).
        self._applied_seq = 0
        self._durable_seq = 0
        self._fence_waiters: list[tuple[int, asyncio.Future[bool]]] = []
        self._changing = 0  # requests that may change the queue, in flight (see begin_change())
        self._clock = clock
        self.read_wait_s = read_wait_s
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
        self._applied_seq = seq = self._applied_seq + 1  # (_write inline: the hot path)
        try:
            await self.persister.write(dirty, state.take_undo())
        finally:
            self._write_ended(seq)
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
            await self._write(dirty, undo)
        except StorageUnavailable as exc:
            log.warning("queue %s: background write failed: %s", self.name, exc)
            return False
        self._publish(events)
        return True

    def begin_change(self) -> None:
        """A request that may change the queue starts; the caller calls :meth:`end_change`
        when it ended, in a ``finally`` (two plain calls, not a wrapper coroutine: every
        enqueue and claim passes here)."""
        self._changing += 1

    def end_change(self) -> None:
        """A request :meth:`begin_change` announced ended (it committed what it changed, or
        raised). When it was the last in flight and memory still holds changes no commit
        took (a handler that raised between its change and its commit: none should), they
        are written in the background, so no read waits on them for long."""
        self._changing -= 1
        if not self._changing and self.durable and self.state.dirty:
            self.after_change()

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
        self._wake_fenced_reads(rolled_back=True)  # a read that saw it computes again
        self._wake_sweeper()  # restored leases may be due

    # -- the read fence (module doc) --
    async def _write(self, dirty: list[Change], undo: dict[str, Snapshot]) -> None:
        """Hand drained changes to the persister under the next applied sequence number."""
        self._applied_seq = seq = self._applied_seq + 1
        try:
            await self.persister.write(dirty, undo)
        finally:
            self._write_ended(seq)

    def _write_ended(self, seq: int) -> None:
        """Hand-over ``seq``'s write ended (stored, or failed and rolled back)."""
        # Batches are written in order: this write's end is the end of all before it.
        if seq > self._durable_seq:
            self._durable_seq = seq
        if self._fence_waiters:
            self._wake_fenced_reads()

    @property
    def applied_seq(self) -> int:
        """The number of the last hand-over of changes to the persister."""
        return self._applied_seq

    @property
    def durable_seq(self) -> int:
        """The number of the last hand-over whose write ended (stored, or rolled back)."""
        return self._durable_seq

    @property
    def waiting_reads(self) -> int:
        """How many reads wait now for a write to end before they reply (a gauge)."""
        return sum(1 for _, fut in self._fence_waiters if not fut.done())

    async def durable_through(self, seq: int, within_s: float | None = None) -> bool:
        """Return True once the writes up to hand-over ``seq`` ended, or a rollback happened
        (the caller compares :attr:`generation`); at once when nothing that old is pending.
        ``within_s`` (clock seconds): return False if neither happened by then."""
        if seq <= self._durable_seq:
            return True
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._fence_waiters.append((seq, fut))
        timer = None if within_s is None else loop.call_later(
            self._clock.to_loop_seconds(within_s), _expire, fut)
        try:
            ended = await fut
        finally:
            if timer is not None:
                timer.cancel()
            if not fut.done() or not fut.result():  # cancelled or timed out: forget it
                self._fence_waiters = [(s, f) for s, f in self._fence_waiters if f is not fut]
        return ended

    def _wake_fenced_reads(self, *, rolled_back: bool = False) -> None:
        """Wake the reads whose changes are now durable; after a rollback, every read (each
        compares :attr:`generation`, and computes again)."""
        if not self._fence_waiters:
            return
        waiting = []
        for seq, fut in self._fence_waiters:
            if fut.done():
                continue
            if rolled_back or seq <= self._durable_seq:
                fut.set_result(True)
            else:
                waiting.append((seq, fut))
        self._fence_waiters = waiting

    async def read(self, compute: Handler, msg: dict[str, Any]) -> dict[str, Any]:
        """Serve a read op: ``compute`` its reply from memory, then wait until everything
        the reply could have seen is durable (the read fence, module doc). Volatile storage,
        or nothing in flight: no wait.

        Raises:
            StorageUnavailable: a rollback happened while this read waited, twice (what it
                saw was not kept, and not again on the second try); or the write it waits
                for did not end within :attr:`read_wait_s` (the storage's request timeout).
        """
        if not self.durable:
            return await compute(msg)
        for _ in range(2):
            generation = self._generation
            reply = await compute(msg)
            # What it saw: every hand-over so far, and the next one if memory holds changes
            # not yet handed over (the next hand-over drains them all).
            dirty = bool(self.state.dirty)
            seq = self._applied_seq + 1 if dirty else self._applied_seq
            if dirty and not self._changing:
                # Nobody in flight will hand these changes over (a call that changed memory
                # outside a request): hand them over now, or this read would wait forever.
                self.after_change()
            if seq > self._durable_seq \
                    and not await self.durable_through(seq, self.read_wait_s):
                raise StorageUnavailable(
                    f"queue {self.name!r}: the storage write this read waits for did not end "
                    f"within {self.read_wait_s:g} s (the storage's request timeout); try again")
            if generation == self._generation:
                return reply
        raise StorageUnavailable(f"queue {self.name!r}: a storage write failed while this "
                                 "read waited for it, twice; try again")

    # -- the owner's other records (module doc) --
    async def apply_aux(self, ns: str, puts: list[tuple[str, bytes]],
                        deletes: list[str]) -> None:
        """Store ``puts`` and delete ``deletes`` in ``ns`` (not a job namespace), in one call,
        with an HA leader's fence. The caller changes its memory only after this returned.

        Raises:
            StorageUnavailable: the write failed.
            FencedOut: the fence refused it (the owner has stopped serving).
        """
        await self._aux.apply(ns, puts, deletes)

    async def put_aux(self, ns: str, key: str, value: bytes) -> None:
        """:meth:`apply_aux` of one put (raises as it does)."""
        await self._aux.apply(ns, [(key, value)], [])

    async def delete_aux(self, ns: str, key: str) -> None:
        """:meth:`apply_aux` of one delete (raises as it does)."""
        await self._aux.apply(ns, [], [key])


def _expire(fut: asyncio.Future[bool]) -> None:
    """A bounded :meth:`WritePath.durable_through` ran out of time."""
    if not fut.done():
        fut.set_result(False)
