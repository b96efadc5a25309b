"""The Storage port: a namespaced key/value store of job records and workflow state.

Every method is O(1) round trips (``scan`` excepted, which recovery uses once at start-up).
Values are opaque bytes. Adapters raise :class:`istos.errors.StorageUnavailable` when the backend
cannot be reached or refuses a write, so the caller can refuse the operation that caused it.

Namespaces the engine uses (``{q}`` is the queue name):
``jobs:{q}`` job records by job id, ``wf:{q}`` chord barriers and chain bookkeeping,
``ledger`` the idempotency ledger, ``events:{key}`` durable pub/sub history.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


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

    async def apply(self, ns: str, puts: list[tuple[str, bytes]], deletes: list[str]) -> None:
        """Write ``puts`` and delete ``deletes`` in one round trip (the owner's group commit)."""

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
