"""The relay's port to an outbox table, and the in-memory adapter the simulator uses.

:class:`OutboxStore` is what :class:`~istos.outbox.relay.OutboxRelay` asks of the database:
claim rows, delete or release them, count them, and (optionally) wake it on commits. The SQL
adapter is :class:`~istos.outbox.sql.SQLOutboxStore`; :class:`MemoryOutbox` keeps rows in a
dict, with transactions that commit or roll back, for the simulator and tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..errors import StorageUnavailable


@dataclass(frozen=True)
class OutboxRow:
    """One row as the relay reads it (the table's columns minus the claim)."""

    id: int
    queue: str
    job_id: str
    body: bytes
    delay_s: float
    priority: int
    dedup_s: float | None
    job_group: str | None
    created_at: float


class OutboxStore(Protocol):
    """What the relay needs of an outbox table. Every call is one short transaction and
    raises :class:`StorageUnavailable` when the database cannot answer."""

    default_poll_s: float

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def claim(self, token: str, now: float, claim_s: float, limit: int,
                    queues: list[str] | None) -> list[OutboxRow]:
        """Mark up to ``limit`` rows that are unclaimed or whose claim lapsed (at ``now``)
        with ``token`` until ``now + claim_s``; return them in id order."""
        ...

    async def finish(self, ids: list[int], token: str, *, delete: bool) -> None:
        """Delete (``delete``) or release the rows ``ids`` still claimed with ``token``."""
        ...

    async def stats(self, now: float) -> dict[str, Any]:
        """``depth``, ``claimed`` and ``oldest_age_s`` (None when empty)."""
        ...

    async def listen(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` on every commit that adds rows, until cancelled; return at once if
        this database cannot tell."""
        ...


@dataclass
class _Held:
    row: OutboxRow
    token: str | None = None
    until: float | None = None


class MemoryOutbox:
    """An outbox table in memory: writers add rows in :meth:`transaction`, which become
    visible (and wake listeners) only if it commits. ``available = False`` makes every relay
    call raise :class:`StorageUnavailable` (an outage); ``latency_s``: each relay call takes
    that long (on the loop's clock) before it acts, as a round trip to a database would."""

    default_poll_s = 0.1

    def __init__(self, *, latency_s: float = 0.0) -> None:
        self.latency_s = latency_s
        self.rows: dict[int, _Held] = {}
        self.available = True
        self._next = 1
        self._wakers: list[Callable[[], None]] = []

    @contextmanager
    def transaction(self) -> Iterator[MemoryTransaction]:
        """Rows added inside commit when the block ends normally; an exception or
        ``txn.rollback()`` drops them all."""
        txn = MemoryTransaction()
        try:
            yield txn
        except BaseException:
            txn.rollback()
            raise
        if not txn.rolled_back:
            for row in txn.pending:
                rid, self._next = self._next, self._next + 1
                self.rows[rid] = _Held(replace(row, id=rid))
            if txn.pending:
                for wake in list(self._wakers):
                    wake()

    async def _check(self) -> None:
        if self.latency_s:
            # The database's round trip, on the loop's (the true) timeline: it is the stand-in
            # store's own delay, not a node's timer, so no node's clock (with its skew) measures it.
            await asyncio.sleep(self.latency_s)
        if not self.available:
            raise StorageUnavailable("the outbox database is unavailable (simulated)")

    async def open(self) -> None:
        await self._check()

    async def close(self) -> None:
        return None

    async def claim(self, token: str, now: float, claim_s: float, limit: int,
                    queues: list[str] | None) -> list[OutboxRow]:
        await self._check()
        out = []
        for rid in sorted(self.rows):
            held = self.rows[rid]
            if (held.until is None or held.until <= now) and \
                    (queues is None or held.row.queue in queues):
                held.token, held.until = token, now + claim_s
                out.append(held.row)
                if len(out) == limit:
                    break
        return out

    async def finish(self, ids: list[int], token: str, *, delete: bool) -> None:
        await self._check()
        for rid in ids:
            held = self.rows.get(rid)
            if held is not None and held.token == token:
                if delete:
                    del self.rows[rid]
                else:
                    held.token = held.until = None

    async def stats(self, now: float) -> dict[str, Any]:
        await self._check()
        oldest = min((h.row.created_at for h in self.rows.values()), default=None)
        return {"depth": len(self.rows),
                "claimed": sum(1 for h in self.rows.values() if h.token is not None),
                "oldest_age_s": None if oldest is None else max(0.0, now - oldest)}

    async def listen(self, wake: Callable[[], None]) -> None:
        self._wakers.append(wake)
        try:
            await asyncio.Event().wait()  # until cancelled
        finally:
            self._wakers.remove(wake)


class MemoryTransaction:
    """The writer's side of one :meth:`MemoryOutbox.transaction`."""

    def __init__(self) -> None:
        self.pending: list[OutboxRow] = []
        self.rolled_back = False

    def enqueue(self, name: str, data: Any, *, now: float, job_id: str,
                **options: Any) -> str:
        """As :func:`istos.outbox.enqueue` (same checks), with the clock reading and the id
        given (the simulator's); returns the job id."""
        from .enqueue import make_row

        row = make_row(name, data, job_id=job_id, now=now, **options)
        self.pending.append(OutboxRow(id=0, **row))
        return job_id

    def rollback(self) -> None:
        self.rolled_back = True
        self.pending.clear()
