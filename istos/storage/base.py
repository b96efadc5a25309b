"""The Storage port: a namespaced key/value store of job records and workflow state.

One role in two port packages: each port package keeps its port in ``base.py`` (this one, and
``transport/base.py``), its adapters beside it.

Every method is O(1) round trips (``scan`` excepted, which recovery uses once at start-up).
Values are opaque bytes. Adapters raise :class:`istos.errors.StorageUnavailable` when the backend
cannot be reached or refuses a write, so the caller can refuse the operation that caused it.

Namespaces the engine uses (``{q}`` is the queue name):
``jobs:{q}`` job records by job id, ``wf:{q}`` chord barriers and chain bookkeeping,
``ledger`` the idempotency ledger, ``events:{key}`` durable pub/sub history.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

LEADER_NS = "#leader"
"""The namespace that leader leases live in (adapters may store them elsewhere)."""

UNSTATED_REQUEST_TIMEOUT_S = 30.0
"""How long the owner waits on a write of a storage that states no ``request_timeout_s``
(:class:`~istos.storage.memory.MemoryStorage`, whose calls complete at once, or a third-party
adapter) before a read that waits for it answers StorageUnavailable."""


def request_timeout_s(storage: object) -> float:
    """How long one call to ``storage`` may wait for the backend's answer: the adapter's
    ``request_timeout_s`` (Redis and SQL: their ``op_timeout_s``), else
    :data:`UNSTATED_REQUEST_TIMEOUT_S`."""
    stated = getattr(storage, "request_timeout_s", None)
    return float(stated) if isinstance(stated, int | float) and stated > 0 \
        else UNSTATED_REQUEST_TIMEOUT_S

TxStep = Callable[[Any], Awaitable[None]]
"""A statement that rides in the same database transaction as an ``apply`` (given the
SQLAlchemy connection): only an SQL storage takes them (``SQLAlchemyStorage.apply(also=)``);
the outbox relay deletes the rows it moved into the queue this way (``istos/outbox``)."""


@dataclass(frozen=True, slots=True)
class Fence:
    """A write condition: leader lease ``name`` must still be at ``epoch`` (held by ``holder``)."""

    name: str
    epoch: int
    holder: str


@dataclass(frozen=True, slots=True)
class LeaderLease:
    """The state of a leader lease: who holds it, at which epoch, until when (caller clock)."""

    holder: str
    epoch: int
    expires_at: float


@runtime_checkable
class Storage(Protocol):
    durable: bool
    """True when data outlives the process that wrote it."""

    shared: bool
    """True when other processes (HA replicas) see the same data."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def put(self, ns: str, key: str, value: bytes) -> None: ...

    async def put_many(self, ns: str, items: list[tuple[str, bytes]]) -> None:
        """Write several keys of one namespace in one round trip."""

    async def apply(self, ns: str, puts: list[tuple[str, bytes]], deletes: list[str], *,
                    fence: Fence | None = None) -> None:
        """Write ``puts`` and delete ``deletes`` in one round trip (the owner's group commit).

        With ``fence``, atomically with the write: if leader lease ``fence.name`` is not at
        ``fence.epoch``, nothing is written and :class:`~istos.errors.FencedOut` is raised. The
        check and the write are one atomic step, so no acquire can fall between them.
        """

    async def get(self, ns: str, key: str) -> bytes | None: ...

    async def delete(self, ns: str, key: str) -> None: ...

    async def scan(self, ns: str) -> list[tuple[str, bytes]]:
        """Every ``(key, value)`` in ``ns``, in no particular order."""

    async def put_if_absent(
        self, ns: str, key: str, value: bytes, *, now: float, expires_at: float | None = None
    ) -> bool:
        """Atomically store ``value`` unless a live entry exists; True if this call stored it.

        An entry whose ``expires_at`` is <= ``now`` counts as absent. Time is passed in (not read)
        so the simulator's clocks apply.
        """

    # -- leader leases (fenced HA leadership) ----------------------------------------------
    # A leader lease has a holder, an epoch that only ever grows, and an expiry judged by the
    # caller's ``now`` (as in put_if_absent). The epoch outlives the expiry: it is never reset.

    async def acquire_leader(self, name: str, holder: str, *, now: float, ttl_s: float,
                             steal_from: str | None = None) -> int | None:
        """Take lease ``name`` for ``holder`` with a new epoch (previous + 1) if it is free,
        expired (``expires_at <= now``), already ``holder``'s, or held by ``steal_from`` (a
        holder the caller knows is gone). Returns the new epoch, or None if someone else holds
        it. Atomic: of N racers, one wins."""

    async def renew_leader(self, name: str, holder: str, epoch: int, *, now: float,
                           ttl_s: float) -> bool:
        """Extend ``holder``'s lease to ``now + ttl_s`` if it is still at ``epoch`` (even if it
        expired meanwhile: nobody took it). False if another epoch began."""

    async def release_leader(self, name: str, holder: str, epoch: int) -> None:
        """Expire the lease now if ``holder`` still holds it at ``epoch`` (a clean stop), so a
        standby need not wait for the expiry. The epoch is kept."""

    async def read_leader(self, name: str) -> LeaderLease | None:
        """The lease's current state, or None if nobody ever held it."""


class FencedStorage:
    """A view of ``storage`` whose writes all carry ``fence`` (an HA leader's extensions, e.g.
    chord barriers, write through it). Reads pass through; a write refused by the fence calls
    ``on_fenced`` and raises FencedOut."""

    def __init__(self, storage: Storage, fence: Fence, on_fenced: Callable[[], None]) -> None:
        self.inner = storage
        self.fence = fence
        self._on_fenced = on_fenced
        self.durable = storage.durable
        self.shared = storage.shared

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # reads, leases and the rest pass through

    async def apply(self, ns: str, puts: list[tuple[str, bytes]], deletes: list[str], *,
                    fence: Fence | None = None, also: Sequence[TxStep] = ()) -> None:
        """The inner storage's ``apply`` under this view's fence (``also``: see
        :data:`TxStep`); raises FencedOut (after ``on_fenced``) when the fence refused it."""
        from ..errors import FencedOut

        extra: dict[str, Any] = {"also": also} if also else {}
        try:
            await self.inner.apply(ns, puts, deletes, fence=fence or self.fence, **extra)
        except FencedOut:
            self._on_fenced()
            raise

    async def put(self, ns: str, key: str, value: bytes) -> None:
        await self.apply(ns, [(key, value)], [])

    async def put_many(self, ns: str, items: list[tuple[str, bytes]]) -> None:
        await self.apply(ns, items, [])

    async def delete(self, ns: str, key: str) -> None:
        await self.apply(ns, [], [key])
