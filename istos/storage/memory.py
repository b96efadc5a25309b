"""In-memory storage: the default. Fast and volatile unless the simulator marks it durable."""

from __future__ import annotations


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

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def put(self, ns: str, key: str, value: bytes) -> None:
        self._data.setdefault(ns, {})[key] = value
        self._expiry.pop((ns, key), None)

    async def put_many(self, ns: str, items: list[tuple[str, bytes]]) -> None:
        bucket = self._data.setdefault(ns, {})
        for key, value in items:
            bucket[key] = value
            self._expiry.pop((ns, key), None)

    async def apply(self, ns: str, puts: list[tuple[str, bytes]], deletes: list[str]) -> None:
        await self.put_many(ns, puts)
        for key in deletes:
            await self.delete(ns, key)

    async def get(self, ns: str, key: str) -> bytes | None:
        return self._data.get(ns, {}).get(key)

    async def delete(self, ns: str, key: str) -> None:
        bucket = self._data.get(ns)
        if bucket is not None:
            bucket.pop(key, None)
        self._expiry.pop((ns, key), None)

    async def scan(self, ns: str) -> list[tuple[str, bytes]]:
        return list(self._data.get(ns, {}).items())

    async def put_if_absent(
        self, ns: str, key: str, value: bytes, *, now: float, expires_at: float | None = None
    ) -> bool:
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
