"""Redis storage: one Redis hash per namespace, shared by every owner replica.

Layout (``P`` is ``key_prefix``)::

    P:{ns}        HASH  key -> value bytes          (what get/put/scan read and write)
    P#exp:{ns}    HASH  key -> expires_at as text   (only keys written by put_if_absent with a TTL)
    P#leader:{n}  HASH  holder, epoch, expires      (a leader lease; see acquire_leader)

Leader leases: the epoch must only ever grow, so the lease hash never expires (a Redis TTL would
delete the epoch with the lease and let a later leader reuse an old epoch); ``expires`` is the
caller-clock time the lease runs out, compared inside the Lua script like put_if_absent's expiry.
Acquire, renew and release are each one Lua script; a fenced ``apply`` checks the epoch and
writes in one script, so no acquire can land between the check and the write.

The expiry hash uses ``#exp:`` rather than a ``:exp`` suffix so that no namespace name can ever
alias another namespace's expiry hash (namespaces such as ``events:{key}`` contain colons).

Expiry is judged by the *caller's* clock: ``put_if_absent`` passes ``now`` into a Lua script
that compares it with the stored ``expires_at``. Redis key TTLs are deliberately not used, because
they run on the server's clock and the simulator (and skewed replicas) must decide for themselves.
Like :class:`~istos.storage.memory.MemoryStorage`, an expired entry stays readable by ``get`` and
``scan`` until it is replaced or deleted; expiry only matters to ``put_if_absent``.

Every operation is one round trip (``scan`` pages through ``HSCAN``). Any failure to reach the
server, or a server refusal (OOM, read-only replica), raises
:class:`~istos.errors.StorageUnavailable` naming the URL (password hidden) and the operation.
The client reconnects on its own: the first call after the server is back succeeds.

No client can hold another hostage: there is no ``WATCH`` and no lock; a script runs to its end
inside the server, and a ``MULTI`` pipeline is sent whole with its ``EXEC``, so a frozen or cut-off
client leaves at most queued commands on its own connection, which block nobody.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from istos.cancel_guard import within
from istos.errors import ConfigError, FencedOut, StorageUnavailable

from .base import Fence, LeaderLease

T = TypeVar("T")

# KEYS[1] data hash, KEYS[2] expiry hash; ARGV: key, value, now, expires_at ('' = never).
# Runs atomically on the server, so N racing callers see exactly one winner.
_PUT_IF_ABSENT_LUA = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  local exp = redis.call('HGET', KEYS[2], ARGV[1])
  if not exp or tonumber(exp) > tonumber(ARGV[3]) then
    return 0
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ARGV[4] == '' then
  redis.call('HDEL', KEYS[2], ARGV[1])
else
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
end
return 1
"""

# KEYS[1] lease hash; ARGV: holder, now, expires_at, steal_from ('' = none). Returns the new
# epoch, or -1 if a live lease is held by someone else.
_ACQUIRE_LUA = """
local cur = redis.call('HMGET', KEYS[1], 'holder', 'epoch', 'expires')
if cur[1] and tonumber(cur[3]) > tonumber(ARGV[2]) and cur[1] ~= ARGV[1]
    and cur[1] ~= ARGV[4] then
  return -1
end
local epoch = (tonumber(cur[2]) or 0) + 1
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'epoch', tostring(epoch), 'expires', ARGV[3])
return epoch
"""

# KEYS[1] lease hash; ARGV: holder, epoch, expires_at ('' = expire now). 1 if still held.
_RENEW_LUA = """
local cur = redis.call('HMGET', KEYS[1], 'holder', 'epoch')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], 'expires', ARGV[3])
return 1
"""

# The writes of one group commit, shared by both apply scripts: ARGV[base] is the number of puts,
# then key/value pairs, then keys to delete (in chunks: unpack has a stack limit).
_WRITES_LUA = """
local last = base + 2 * tonumber(ARGV[base])
local i = base + 1
while i <= last do
  local j = math.min(i + 999, last)
  redis.call('HSET', KEYS[1], unpack(ARGV, i, j))
  local names = {}
  for k = i, j, 2 do names[#names + 1] = ARGV[k] end
  redis.call('HDEL', KEYS[2], unpack(names))
  i = j + 1
end
i = last + 1
while i <= #ARGV do
  local j = math.min(i + 999, #ARGV)
  redis.call('HDEL', KEYS[1], unpack(ARGV, i, j))
  redis.call('HDEL', KEYS[2], unpack(ARGV, i, j))
  i = j + 1
end
return 1
"""

# KEYS[1] data hash, KEYS[2] expiry hash, KEYS[3] lease hash; ARGV: epoch, holder, number of
# puts, then key/value pairs, then keys to delete. 0 (nothing written) if the epoch moved on.
_FENCED_APPLY_LUA = """
local cur = redis.call('HMGET', KEYS[3], 'epoch', 'holder')
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] then
  return 0
end
local base = 3
""" + _WRITES_LUA

# KEYS[1] data hash, KEYS[2] expiry hash; ARGV: number of puts, then key/value pairs, then keys
# to delete. The unfenced apply: one command (EVALSHA) instead of MULTI, HSET, HDEL... EXEC,
# which costs the client less to build and parse per group commit.
_APPLY_LUA = "local base = 1\n" + _WRITES_LUA

_RELEASED = "-1e300"  # an expiry before any caller's clock
_SCAN_PAGE = 1000


def _redact(url: str) -> str:
    """``url`` with any password replaced by ``***`` so it is safe to put in an error message."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable redis url>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    netloc = f"{user}:***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _glob_escape(text: str) -> str:
    """Escape Redis MATCH glob metacharacters so a prefix matches only itself."""
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


class RedisStoragePlugin:
    """Durable, shared storage on a Redis server (``redis.asyncio``).

    ``connect_timeout_s`` bounds establishing a connection, ``op_timeout_s`` bounds waiting for
    a reply; a whole call is additionally capped at roughly twice their sum (one reconnect).
    Raises :class:`~istos.errors.ConfigError` at construction if ``redis`` is not installed,
    or for an empty ``key_prefix`` or a timeout <= 0. Every call raises
    :class:`~istos.errors.StorageUnavailable` (nothing written) when the server cannot be
    reached in time or refuses, and an HA leader's write :class:`~istos.errors.FencedOut` once
    another replica holds the epoch.
    """

    durable: bool = True
    shared: bool = True

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        key_prefix: str = "istos",
        connect_timeout_s: float = 2.0,
        op_timeout_s: float = 2.0,
    ) -> None:
        # Imported here, not at module top, so `import istos` never needs redis installed.
        try:
            import redis.asyncio  # noqa: F401
        except ImportError as exc:
            raise ConfigError(
                "RedisStoragePlugin needs the redis package: pip install istos-nb[redis]"
            ) from exc
        if not key_prefix:
            raise ConfigError("RedisStoragePlugin key_prefix must be a non-empty string")
        if connect_timeout_s <= 0 or op_timeout_s <= 0:
            raise ConfigError("RedisStoragePlugin timeouts must be > 0 seconds")
        self.url = url
        self.key_prefix = key_prefix
        self.connect_timeout_s = connect_timeout_s
        self.op_timeout_s = op_timeout_s
        self._safe_url = _redact(url)
        # One reconnect attempt may be needed, hence the factor of two.
        self._deadline_s = 2 * (connect_timeout_s + op_timeout_s) + 0.5
        self._client: Any = None
        self._script: Any = None
        self._scripts: dict[str, Any] = {}

    @property
    def request_timeout_s(self) -> float:
        """How long a call waits for the server's reply (``op_timeout_s``): the owner's read
        fence waits no longer than this for a write (``owner/persistence/write_path.py``)."""
        return self.op_timeout_s

    # -- keys ---------------------------------------------------------------------------------

    def _data_key(self, ns: str) -> str:
        return f"{self.key_prefix}:{ns}"

    def _exp_key(self, ns: str) -> str:
        return f"{self.key_prefix}#exp:{ns}"

    def _leader_key(self, name: str) -> str:
        return f"{self.key_prefix}#leader:{name}"

    # -- plumbing -----------------------------------------------------------------------------

    def _ensure_client(self) -> Any:
        if self._client is None:
            from redis.asyncio import Redis
            from redis.asyncio.retry import Retry
            from redis.backoff import NoBackoff

            # Retry once, immediately: after a server restart every pooled socket is dead and
            # the first command on each must reconnect. redis-py's default (3 retries with
            # exponential backoff) would stretch an outage report to many seconds.
            self._client = Redis.from_url(
                self.url,
                socket_connect_timeout=self.connect_timeout_s,
                socket_timeout=self.op_timeout_s,
                retry=Retry(NoBackoff(), 1),
            )
            # register_script uses EVALSHA and reloads the script after a server restart
            # (NOSCRIPT), so recovery needs no extra handling here.
            self._script = self._client.register_script(_PUT_IF_ABSENT_LUA)
            self._scripts = {name: self._client.register_script(src) for name, src in (
                ("acquire", _ACQUIRE_LUA), ("renew", _RENEW_LUA),
                ("fenced_apply", _FENCED_APPLY_LUA), ("apply", _APPLY_LUA))}
        return self._client

    async def _call(self, op: str, fn: Callable[[Any], Awaitable[T]]) -> T:
        """Run ``fn(client)`` under the deadline, translating backend failures."""
        from redis.exceptions import RedisError

        client = self._ensure_client()
        try:
            # redis-py waits for each command with wait_for, which on Python 3.11 can swallow
            # a cancel of this Task: within() raises it.
            return await within(fn(client), self._deadline_s)
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            raise StorageUnavailable(
                f"Redis at {self._safe_url} failed during {op}: {type(exc).__name__}: {exc}"
            ) from exc

    # -- Storage protocol ---------------------------------------------------------------------

    async def open(self) -> None:
        """Connect and check the server answers; raises StorageUnavailable if it does not."""
        await self._call("open", lambda c: c.ping())

    async def close(self) -> None:
        """Release the connection pool. The instance may be opened again afterwards."""
        client, self._client, self._script = self._client, None, None
        self._scripts = {}
        if client is not None:
            await client.aclose()

    async def put(self, ns: str, key: str, value: bytes) -> None:
        """Store ``value``; a plain put clears any expiry set by ``put_if_absent``."""

        async def run(c: Any) -> None:
            # MULTI/EXEC: both hashes change together, in one round trip.
            async with c.pipeline(transaction=True) as pipe:
                pipe.hset(self._data_key(ns), key, value)
                pipe.hdel(self._exp_key(ns), key)
                await pipe.execute()

        await self._call("put", run)

    async def put_many(self, ns: str, items: list[tuple[str, bytes]]) -> None:
        """Store every item with one HSET; later duplicates of a key win."""
        if not items:
            return
        mapping = dict(items)

        async def run(c: Any) -> None:
            async with c.pipeline(transaction=True) as pipe:
                pipe.hset(self._data_key(ns), mapping=mapping)
                pipe.hdel(self._exp_key(ns), *mapping.keys())
                await pipe.execute()

        await self._call("put_many", run)

    async def apply(self, ns: str, puts: list[tuple[str, bytes]], deletes: list[str], *,
                    fence: Fence | None = None) -> None:
        """Store ``puts`` and delete ``deletes`` in one round trip: one Lua script, atomic (with
        ``fence``: a script that checks the epoch first; FencedOut if it moved on)."""
        mapping = dict(puts)
        if not mapping and not deletes:
            return
        if fence is not None:
            await self._fenced_apply(ns, mapping, deletes, fence)
            return
        await self._scripted_apply(ns, mapping, deletes)

    async def get(self, ns: str, key: str) -> bytes | None:
        return await self._call("get", lambda c: c.hget(self._data_key(ns), key))

    async def delete(self, ns: str, key: str) -> None:
        async def run(c: Any) -> None:
            async with c.pipeline(transaction=True) as pipe:
                pipe.hdel(self._data_key(ns), key)
                pipe.hdel(self._exp_key(ns), key)
                await pipe.execute()

        await self._call("delete", run)

    async def scan(self, ns: str) -> list[tuple[str, bytes]]:
        """Every entry of ``ns``, paged with HSCAN so a large hash never blocks the server.

        Each page gets its own deadline; HSCAN may repeat a field while the hash is being
        rehashed, so results are collected in a dict.
        """
        name = self._data_key(ns)
        found: dict[str, bytes] = {}
        cursor = 0
        while True:
            def page_at(c: Any, cur: int = cursor) -> Any:
                return c.hscan(name, cur, count=_SCAN_PAGE)

            cursor, page = await self._call("scan", page_at)
            for field, value in page.items():
                found[field.decode("utf-8")] = value
            if cursor == 0:
                break
        return list(found.items())

    async def put_if_absent(
        self, ns: str, key: str, value: bytes, *, now: float, expires_at: float | None = None
    ) -> bool:
        """Atomically store ``value`` unless a live entry exists (a Lua script; see module doc).

        An entry counts as live when it has no expiry or its ``expires_at`` > ``now``.
        Caveat: if the connection drops after the server ran the script but before the reply
        arrived, the automatic retry may report False for a write that did happen.
        """
        exp_arg = "" if expires_at is None else repr(float(expires_at))

        async def run(c: Any) -> Any:
            return await self._script(
                keys=[self._data_key(ns), self._exp_key(ns)],
                args=[key, value, repr(float(now)), exp_arg],
                client=c,
            )

        return bool(await self._call("put_if_absent", run))

    async def _scripted_apply(self, ns: str, mapping: dict[str, bytes],
                              deletes: list[str]) -> None:
        """``apply`` as one Lua script (atomic like MULTI/EXEC, one command on the wire)."""
        args: list[Any] = [str(len(mapping))]
        for key, value in mapping.items():
            args += (key, value)
        args += list(dict.fromkeys(deletes))
        keys = [self._data_key(ns), self._exp_key(ns)]

        async def run(c: Any) -> Any:
            self._ensure_client()
            return await self._scripts["apply"](keys=keys, args=args, client=c)

        await self._call("apply", run)

    async def _fenced_apply(self, ns: str, mapping: dict[str, bytes], deletes: list[str],
                            fence: Fence) -> None:
        args: list[Any] = [str(fence.epoch), fence.holder, str(len(mapping))]
        for key, value in mapping.items():
            args += (key, value)
        args += list(dict.fromkeys(deletes))
        keys = [self._data_key(ns), self._exp_key(ns), self._leader_key(fence.name)]

        async def run(c: Any) -> Any:
            self._ensure_client()
            return await self._scripts["fenced_apply"](keys=keys, args=args, client=c)

        if not await self._call("apply", run):
            raise FencedOut(f"Redis at {self._safe_url}: leader lease {fence.name!r} is no "
                            f"longer at epoch {fence.epoch}; nothing was written")

    # -- leader leases ------------------------------------------------------------------------

    async def acquire_leader(self, name: str, holder: str, *, now: float, ttl_s: float,
                             steal_from: str | None = None) -> int | None:
        """Take the lease with a new epoch if free, expired, ours or ``steal_from``'s."""
        args = [holder, repr(float(now)), repr(float(now + ttl_s)), steal_from or ""]

        async def run(c: Any) -> Any:
            self._ensure_client()
            return await self._scripts["acquire"](keys=[self._leader_key(name)], args=args,
                                                  client=c)

        epoch = int(await self._call("acquire_leader", run))
        return None if epoch < 0 else epoch

    async def _renew(self, op: str, name: str, holder: str, epoch: int, expires: str) -> bool:
        args = [holder, str(epoch), expires]

        async def run(c: Any) -> Any:
            self._ensure_client()
            return await self._scripts["renew"](keys=[self._leader_key(name)], args=args,
                                                client=c)

        return bool(await self._call(op, run))

    async def renew_leader(self, name: str, holder: str, epoch: int, *, now: float,
                           ttl_s: float) -> bool:
        """Extend the lease if ``holder`` still holds it at ``epoch``."""
        return await self._renew("renew_leader", name, holder, epoch, repr(float(now + ttl_s)))

    async def release_leader(self, name: str, holder: str, epoch: int) -> None:
        """Expire the lease now if still ``holder``'s at ``epoch`` (the epoch stays)."""
        await self._renew("release_leader", name, holder, epoch, _RELEASED)

    async def read_leader(self, name: str) -> LeaderLease | None:
        raw = await self._call("read_leader", lambda c: c.hmget(
            self._leader_key(name), "holder", "epoch", "expires"))
        if raw[0] is None:
            return None
        return LeaderLease(raw[0].decode("utf-8"), int(raw[1]), float(raw[2]))

    # -- helpers (admin and tests) ------------------------------------------------------------

    async def clear_namespace(self, ns: str) -> None:
        """Delete every entry of ``ns`` (both hashes) in one round trip."""
        keys = (self._data_key(ns), self._exp_key(ns))
        await self._call("clear_namespace", lambda c: c.delete(*keys))

    async def wipe(self) -> None:
        """Delete every key this plugin's prefix owns. Meant for tests; uses SCAN, not KEYS."""
        prefix = _glob_escape(self.key_prefix)
        for pattern in (f"{prefix}:*", f"{prefix}#exp:*", f"{prefix}#leader:*"):
            def collect(c: Any, p: str = pattern) -> Any:
                return self._collect(c, p)

            keys: list[bytes] = await self._call("wipe", collect)
            for start in range(0, len(keys), 500):
                batch = keys[start : start + 500]

                def drop(c: Any, b: list[bytes] = batch) -> Any:
                    return c.delete(*b)

                await self._call("wipe", drop)

    @staticmethod
    async def _collect(client: Any, pattern: str) -> list[bytes]:
        return [key async for key in client.scan_iter(match=pattern, count=1000)]
