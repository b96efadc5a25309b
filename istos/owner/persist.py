"""Write-through of job records, in order, with group commit and rollback on failure.

Every caller waits until its changes are stored (write-through), but callers that arrive while a
write is in flight share the next round trip: one ``apply`` per batch, so a busy owner does
not pay one storage round trip per job. Later changes to the same key win within a batch, and
batches are written strictly in order, so storage never goes back to an older version of a job.
The caller that started the writing returns once its own batch is stored: the batches queued
behind it are written on by a task, not by that caller before it may reply.

Write, then apply: each change arrives with the snapshots of the records it changed (its undo).
When a batch fails, that batch *and every batch queued behind it* (they were built on top of it
in memory) fail with :class:`StorageUnavailable`, and ``on_failure`` receives the snapshots of
them all, earliest first, so the owner can put its memory back to what storage holds.

One batch may overtake the queue: while a batch is in flight, the changes queued behind it go
out at once, in a second write (the *side* write), when none of their keys is in the batch in
flight (and they carry no SQL statements); at most one side write is in flight, and the next
batch waits until it is done. Writes to different keys commute, so storage still never goes
back to an older version of any job; a sequential producer's enqueue no longer waits for a
worker's claim or ack write to come back first (``bench.durable_overlap``). Failure keeps its
meaning for everything queued: a failed batch fails every change queued behind it that was
not sent yet, and a batch sent after a side write waits for it and fails with it. A side
write already in flight when the batch it overtook fails stands on its own (its keys are
none of that batch's): it is stored, or fails, as any write; the failed batch's snapshots put
back only that batch's own keys (and those of what was queued behind it).

With a ``fence`` (an HA leader's epoch), every write is conditional on the fence still holding;
a write refused by the fence raises :class:`~istos.errors.FencedOut`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgpack

from ..core.dedup import DedupMark, is_mark, mark_from_dict
from ..core.records import JobRecord, encode_record
from ..core.state import Snapshot
from ..errors import StorageUnavailable
from ..storage.base import Fence, Storage, TxStep

FailureHook = Callable[[dict[str, Snapshot], StorageUnavailable], None]



class Persister:
    #: Whether changes queued behind a batch in flight, on none of its keys, may go out at once
    #: in a side write (see the module doc). A class attribute for benches' A/B.
    overtake: bool = True
    #: Whether the caller that started the writing returns once its own batch is stored,
    #: handing the loop to a task (True), or writes every batch queued behind it first.
    #: A class attribute for benches' A/B.
    hand_over: bool = True

    def __init__(self, storage: Storage, ns: str, *, on_failure: FailureHook | None = None,
                 fence: Fence | None = None) -> None:
        self._storage = storage
        self._ns = ns
        self.on_failure = on_failure
        self.fence = fence
        self._pending: dict[str, bytes | None] = {}
        self._pending_undo: dict[str, Snapshot] = {}
        self._pending_also: list[TxStep] = []
        self._waiters: list[asyncio.Future[None]] = []
        self._flushing = False
        self._flying: dict[str, bytes | None] = {}  # the keys of the ordered batch in flight
        self._side: asyncio.Future[bool] | None = None  # a side write in flight: True = stored
        self._bare = False  # a caller with no changes waits among the queued: no overtaking
        self._tasks: set[asyncio.Task[None]] = set()  # a flush loop carried on (strong refs)

    async def write(self, changes: Iterable[JobRecord | str | DedupMark],
                    undo: dict[str, Snapshot] | None = None, *,
                    also: Sequence[TxStep] = ()) -> None:
        """Store ``changes`` (records, or ids to delete); raise StorageUnavailable on failure.

        With no changes, still waits for the writes already queued or in flight (a caller whose
        changes another caller's batch took along must not reply before they are stored).
        ``also``: SQL statements to run in the same transaction as the batch that carries these
        changes (an SQL storage only: :data:`~istos.storage.base.TxStep`).
        """
        if also:
            self._pending_also.extend(also)
        any_change = False
        for change in changes:
            any_change = True
            if isinstance(change, str):
                self._pending[change] = None
            elif isinstance(change, DedupMark):  # in place of the forgotten record
                self._pending[change.job_id] = msgpack.packb(change.to_dict())
            else:
                # Encode now: the record keeps changing in memory after this call.
                self._pending[change.job_id] = encode_record(change)
        if undo:
            pending_undo = self._pending_undo
            for job_id, snap in undo.items():
                pending_undo.setdefault(job_id, snap)  # the earliest snapshot wins
        if not any_change and not self._flushing and not self._waiters and self._side is None:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        if not any_change:
            self._bare = True  # it waits for what is in flight too: the queue goes in order
        if any_change and self._may_overtake():
            await self._send_side()
        elif not self._flushing:
            # No write in flight: this caller flushes (no extra task). Callers arriving while
            # it awaits storage queue up and are written by the same flush loop, in order; once
            # its own batch is settled, a task carries the loop on (see _flush).
            self._flushing = True
            await self._flush(fut)
        await fut

    def _may_overtake(self) -> bool:
        """Whether what is queued may go out now beside the batch in flight: an ordered batch
        is in flight, no side write is, nothing queued carries statements, and no queued key
        is one of the batch's in flight."""
        if not (self.overtake and self._flushing and self._flying and self._side is None) \
                or self._pending_also or self._bare:
            return False
        flying = self._flying
        return not any(key in flying for key in self._pending)

    async def _send_side(self) -> None:
        """Write everything queued now, beside the ordered batch in flight (the caller's own
        changes among it); the ordered loop sends nothing until this is done."""
        batch, waiters, undo = self._pending, self._waiters, self._pending_undo
        self._pending, self._waiters, self._pending_undo = {}, [], {}
        side = self._side = asyncio.get_running_loop().create_future()
        stored = False
        try:
            stored = await self._apply(batch, [], waiters, undo)
        finally:
            self._side = None
            side.set_result(stored)

    async def _apply(self, batch: dict[str, bytes | None], also: list[TxStep],
                     waiters: list[asyncio.Future[None]], undo: dict[str, Snapshot]) -> bool:
        """Write one batch; settle its waiters (and, on failure, what is queued behind it).
        Returns whether it was stored."""
        try:
            puts = [(k, v) for k, v in batch.items() if v is not None]
            deletes = [k for k, v in batch.items() if v is None]
            if also:  # (only an SQL storage is ever handed statements: see TxStep)
                extra: dict[str, Any] = {"also": also}
                if self.fence is not None:
                    extra["fence"] = self.fence
                await self._storage.apply(self._ns, puts, deletes, **extra)
            elif (puts or deletes) and self.fence is None:
                await self._storage.apply(self._ns, puts, deletes)
            elif puts or deletes:
                await self._storage.apply(self._ns, puts, deletes, fence=self.fence)
        except Exception as exc:  # adapters raise StorageUnavailable; be safe with others
            err = exc if isinstance(exc, StorageUnavailable) else StorageUnavailable(
                f"storage write for {self._ns!r} failed: {exc!r}")
            self._fail(waiters, undo, err)
            return False
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        return True

    async def _flush(self, mine: asyncio.Future[None] | None = None) -> None:
        """Write the queued batches in order until none is left (``_flushing`` is set by the
        caller and cleared here). ``mine``: the flushing caller's own future; once it is
        settled, the rest of the loop runs in a task, so that caller's reply never waits for
        the writes of callers that came after it."""
        handed_over = False
        try:
            while self._waiters:
                if mine is not None and self.hand_over and mine.done():
                    task = asyncio.get_running_loop().create_task(self._flush())
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                    handed_over = True
                    return
                side = self._side
                if side is not None:
                    # Sent before what is queued now, which was built on top of it: wait for
                    # it (its failure fails everything queued, see _fail).
                    await asyncio.shield(side)
                    continue
                batch, waiters, undo = self._pending, self._waiters, self._pending_undo
                also = self._pending_also
                self._pending, self._waiters, self._pending_undo = {}, [], {}
                self._pending_also = []
                self._bare = False
                self._flying = batch
                try:
                    await self._apply(batch, also, waiters, undo)
                finally:
                    self._flying = {}
        finally:
            if not handed_over:
                self._flushing = False

    def _fail(self, waiters: list[asyncio.Future[None]], undo: dict[str, Snapshot],
              err: StorageUnavailable) -> None:
        # The batches queued behind the failed one were applied in memory on top of it:
        # they fail with it (never written), and all their snapshots go back together.
        waiters = waiters + self._waiters
        for job_id, snap in self._pending_undo.items():
            undo.setdefault(job_id, snap)
        self._pending, self._waiters, self._pending_undo = {}, [], {}
        self._pending_also = []
        self._bare = False
        if self.on_failure is not None:
            self.on_failure(undo, err)
        for fut in waiters:
            if not fut.done():
                fut.set_exception(err)
                fut.exception()  # retrieved: a waiter gone (cancelled) must not warn

    async def load(self) -> list[JobRecord]:
        """The stored job records (dedup marks left out)."""
        return (await self.load_all())[0]

    async def load_all(self) -> tuple[list[JobRecord], list[DedupMark]]:
        """The stored job records, and the dedup marks stored in place of forgotten ones."""
        records, marks = [], []
        for key, raw in await self._storage.scan(self._ns):
            d = msgpack.unpackb(raw, raw=False, strict_map_key=False)
            if isinstance(d, dict) and is_mark(d):
                mark = mark_from_dict(key, d)
                if mark is not None:
                    marks.append(mark)
            else:
                records.append(JobRecord.from_dict(d))
        return records, marks
