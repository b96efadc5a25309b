"""Write-through of job records, in order, with group commit and rollback on failure.

Every caller waits until its changes are stored (write-through), but callers that arrive while a
write is in flight share the next round trip: one ``apply`` per batch, so a busy owner does
not pay one storage round trip per job. Later changes to the same key win within a batch, and
batches are written strictly in order, so storage never goes back to an older version of a job.

Write, then apply: each change arrives with the snapshots of the records it changed (its undo).
When a batch fails, that batch *and every batch queued behind it* (they were built on top of it
in memory) fail with :class:`StorageUnavailable`, and ``on_failure`` receives the snapshots of
them all, earliest first, so the owner can put its memory back to what storage holds.

With a ``fence`` (an HA leader's epoch), every write is conditional on the fence still holding;
a write refused by the fence raises :class:`~istos.errors.FencedOut`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import msgpack

from ...core.dedup import DedupMark, is_mark, mark_from_dict
from ...core.records import JobRecord, encode_record
from ...core.state import Snapshot
from ...errors import StorageUnavailable
from ...storage.base import Fence, Storage, TxStep

FailureHook = Callable[[dict[str, Snapshot], StorageUnavailable], None]



class Persister:
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
        if not any_change and not self._flushing and not self._waiters:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        if not self._flushing:
            # No write in flight: this caller flushes (no extra task). Callers arriving while
            # it awaits storage queue up and are written by the same flush loop, in order.
            self._flushing = True
            try:
                await self._flush()
            finally:
                self._flushing = False
        await fut

    async def _flush(self) -> None:
        while self._waiters:
            batch, waiters, undo = self._pending, self._waiters, self._pending_undo
            also = self._pending_also
            self._pending, self._waiters, self._pending_undo = {}, [], {}
            self._pending_also = []
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
                continue
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    def _fail(self, waiters: list[asyncio.Future[None]], undo: dict[str, Snapshot],
              err: StorageUnavailable) -> None:
        # The batches queued behind the failed one were applied in memory on top of it:
        # they fail with it (never written), and all their snapshots go back together.
        waiters = waiters + self._waiters
        for job_id, snap in self._pending_undo.items():
            undo.setdefault(job_id, snap)
        self._pending, self._waiters, self._pending_undo = {}, [], {}
        self._pending_also = []
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
