"""In-memory storage: the default. Fast and volatile unless the simulator marks it durable."""

from __future__ import annotations

from istos.errors import FencedOut, StorageUnavailable

from .base import Fence, LeaderLease


class MemoryStorage:
    """A dict of dicts.

    ``durable=True`` is for the simulator: the same object is handed to a restarted owner, which
    then recovers from it exactly as it would from Redis.
    """

    def __init__(self, *, durable: bool = False, shared: bool = False) -> None:
        self.durable = durable
        self.shared = shared
        self._data: dict[str, dict[str, bytes]] = {}
        self._expiry: dict[tuple[str, str], float] = {}
        self._leaders: dict[str, LeaderLease] = {}
        self.available = True  # the simulator's storage outage: False refuses every call

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def put(self, ns: str, key: str, value: bytes) -> None:
        self._check()
        self._data.setdefault(ns, {})[key] = value
        self._expiry.pop((ns, key), None)

    async def put_many(self, ns: str, items: list[tuple[str, bytes]]) -> None:
        self._check()
        bucket = self._data.setdefault(ns, {})
        for key, value in items:
            bucket[key] = value
            self._expiry.pop((ns, key), None)

    async def apply(self, ns: str, puts: list[tuple[str, bytes]], deletes: list[str], *,
                    fence: Fence | None = None) -> None:
        self._check()
        if fence is not None:
            lease = self._leaders.get(fence.name)
            if lease is None or lease.epoch != fence.epoch or lease.holder != fence.holder:
                raise FencedOut(f"leader lease {fence.name!r} is no longer at epoch "
                                f"{fence.epoch} (now {lease.epoch if lease else None})")
        await self.put_many(ns, puts)
        for key in deletes:
            await self.delete(ns, key)

    async def get(self, ns: str, key: str) -> bytes | None:
        self._check()
        return self._data.get(ns, {}).get(key)

    async def delete(self, ns: str, key: str) -> None:
        self._check()
        bucket = self._data.get(ns)
        if bucket is not None:
            bucket.pop(key, None)
        self._expiry.pop((ns, key), None)

    async def scan(self, ns: str) -> list[tuple[str, bytes]]:
        self._check()
        return list(self._data.get(ns, {}).items())

    def snapshot(self, ns: str) -> dict[str, bytes]:
        """A copy of namespace ``ns`` now, synchronous and read-only, whether or not the
        storage is ``available``: what an in-process observer (the simulator's end-of-run
        check) reads; the engine itself uses :meth:`scan`."""
        return dict(self._data.get(ns, {}))

    async def put_if_absent(
        self, ns: str, key: str, value: bytes, *, now: float, expires_at: float | None = None
    ) -> bool:
        self._check()
        bucket = self._data.setdefault(ns, {})
        if key in bucket:
            exp = self._expiry.get((ns, key))
            if exp is None or exp > now:
                return False
        bucket[key] = value
        if expires_at is None:
            self._expiry.pop((ns, key), None)
        else:
            self._expiry[(ns, key)] = expires_at
        return True

    # -- leader leases --
    async def acquire_leader(self, name: str, holder: str, *, now: float, ttl_s: float,
                             steal_from: str | None = None) -> int | None:
        self._check()
        lease = self._leaders.get(name)
        if lease is not None and lease.expires_at > now and lease.holder not in (
                holder, steal_from):
            return None
        epoch = (lease.epoch if lease is not None else 0) + 1
        self._leaders[name] = LeaderLease(holder, epoch, now + ttl_s)
        return epoch

    async def renew_leader(self, name: str, holder: str, epoch: int, *, now: float,
                           ttl_s: float) -> bool:
        self._check()
        lease = self._leaders.get(name)
        if lease is None or lease.epoch != epoch or lease.holder != holder:
            return False
        self._leaders[name] = LeaderLease(holder, epoch, now + ttl_s)
        return True

    async def release_leader(self, name: str, holder: str, epoch: int) -> None:
        self._check()
        lease = self._leaders.get(name)
        if lease is not None and lease.epoch == epoch and lease.holder == holder:
            self._leaders[name] = LeaderLease(holder, epoch, float("-inf"))

    async def read_leader(self, name: str) -> LeaderLease | None:
        self._check()
        return self._leaders.get(name)

    def _check(self) -> None:
        if not self.available:
            raise StorageUnavailable("storage is unavailable (a simulated outage)")
