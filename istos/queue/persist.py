"""Write-through of job records, in order, with group commit.

Every caller waits until its changes are stored (write-through), but callers that arrive while a
write is in flight share the next round trip: one ``put_many`` per batch, so a busy owner does
not pay one storage round trip per job. Later changes to the same key win within a batch, and
batches are written strictly in order, so storage never goes back to an older version of a job.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import msgpack

from ..errors import StorageUnavailable
from ..storage.base import Storage
from .state import JobRecord


def encode_record(rec: JobRecord) -> bytes:
    return msgpack.packb(rec.to_dict(), use_bin_type=True)


def decode_record(raw: bytes) -> JobRecord:
    return JobRecord.from_dict(msgpack.unpackb(raw, raw=False, strict_map_key=False))


class Persister:
    def __init__(self, storage: Storage, ns: str) -> None:
        self._storage = storage
        self._ns = ns
        self._pending: dict[str, bytes | None] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._flushing = False

    async def write(self, changes: Iterable[JobRecord | str]) -> None:
        """Store ``changes`` (records, or ids to delete); raise StorageUnavailable on failure."""
        any_change = False
        for change in changes:
            any_change = True
            if isinstance(change, str):
                self._pending[change] = None
            else:
                # Encode now: the record keeps changing in memory after this call.
                self._pending[change.job_id] = encode_record(change)
        if not any_change:
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
            batch, waiters = self._pending, self._waiters
            self._pending, self._waiters = {}, []
            try:
                puts = [(k, v) for k, v in batch.items() if v is not None]
                deletes = [k for k, v in batch.items() if v is None]
                await self._storage.apply(self._ns, puts, deletes)
            except Exception as exc:  # adapters raise StorageUnavailable; be safe with others
                err = exc if isinstance(exc, StorageUnavailable) else StorageUnavailable(
                    f"storage write for {self._ns!r} failed: {exc!r}")
                for fut in waiters:
                    if not fut.done():
                        fut.set_exception(err)
                continue
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    async def load(self) -> list[JobRecord]:
        return [decode_record(raw) for _, raw in await self._storage.scan(self._ns)]
