"""The idempotency ledger: remember which side effects already happened, across processes.

``async with app.idempotent("charge:42", ttl_s=3600) as first:`` yields True to exactly one
caller per key within the TTL, in every process sharing the app's storage, and False to the rest:
the block does its side effect only ``if first``. It is how a job that is delivered twice (the
queue is at-least-once) charges the card once.

It needs only the app's storage, never the mesh, so it works whether or not the app serves: a
web handler or a script that never calls ``serving()`` uses it as it is. The Redis and SQL
adapters connect on first use; ``serving()``'s exit closes the storage, and a process that never
serves closes it itself (``await app.node.storage.close()``) when done. An unreachable storage
raises :class:`~istos.errors.StorageUnavailable` on entry, with nothing claimed.

Layout, in the ``ledger`` namespace of the Storage port (so memory, Redis and SQL all work)::

    run|{key}    the claim of the caller now inside the block; written with
                 put_if_absent(expires_at=now + in_progress_ttl_s), which the adapters make
                 atomic (a Lua script on Redis, a primary key in SQL), so one racer wins
    done|{key}   written when the winner's block exits normally; expires_at=now + ttl_s

Two keys rather than one rewritten entry: ``put_if_absent`` cannot replace a live claim, and a
delete-then-rewrite of the claim would open a window in which a concurrent caller wins the key
after the side effect was done. With two keys the holder writes ``done`` *before* releasing
``run``, and a caller that wins ``run`` checks ``done`` before saying True, so no window exists.

Outcomes of the block:

* returns: ``done`` is kept for ``ttl_s`` (first=False for everyone until then), claim released.
* raises an ``Exception``: the claim is released and the exception propagates, so a retry gets
  first=True and tries the side effect again.
* cancelled, or the process dies: the claim stays, so others get False until
  ``in_progress_ttl_s`` has passed since the claim, after which the next caller gets True. Pick it
  longer than the block can take: a holder still inside when it lapses may overlap a second one.

Expiry is judged with the node's clock (``now`` is passed to storage), so simulated and skewed
clocks apply. Expired records stay in storage until the key is claimed again or
:meth:`Ledger.purge_expired` removes them: the Storage port has no background expiry.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

from .. import codec
from ..errors import ConfigError, ProtocolError

if TYPE_CHECKING:
    from ..node import Node

log = logging.getLogger("istos.features.ledger")

NS = "ledger"
DONE = "done"
IN_PROGRESS = "in_progress"
DEFAULT_TTL_S = 86_400.0
DEFAULT_IN_PROGRESS_TTL_S = 300.0
MAX_KEY_LEN = 200  # "done|" + key must fit the SQL adapter's 255-character key column


def check_ledger_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise ConfigError(f"idempotency key must be a non-empty string, got {key!r}")
    if len(key) > MAX_KEY_LEN:
        raise ConfigError(f"idempotency key {key[:40]!r}... is {len(key)} characters; the limit "
                          f"is {MAX_KEY_LEN} (hash long keys, e.g. with hashlib.sha256)")
    return key


def _duration(option: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{option} must be a finite number > 0, got {value!r}")
    return float(value)


def _record(state: str, at: float, expires_at: float, holder: str, token: str) -> bytes:
    return codec.encode_message({"v": codec.PROTOCOL_VERSION, "state": state, "at": at,
                                 "exp": expires_at, "by": holder, "tok": token})


def _decode(raw: bytes) -> dict[str, object] | None:
    try:
        return codec.decode_message(raw)
    except ProtocolError as exc:
        log.warning("unreadable ledger record (%s); treating it as live", exc)
        return None


def _live(raw: bytes, now: float) -> bool:
    """Whether a stored record is unexpired at ``now``.

    ``get`` returns expired entries too (only ``put_if_absent`` honours expiry), so the record
    carries its own ``exp``. An unreadable record counts as live: repeating a side effect is the
    worse mistake.
    """
    rec = _decode(raw)
    if rec is None:
        return True
    exp = rec.get("exp")
    return not isinstance(exp, (int, float)) or exp > now


class Ledger:
    """The ledger of one node: its storage, clock and id source (see the module docstring)."""

    def __init__(self, node: Node) -> None:
        self._storage = node.storage
        self._clock = node.clock
        self._ids = node.ids
        self._holder = node.node_id

    def claim(self, key: str, *, ttl_s: float = DEFAULT_TTL_S,
              in_progress_ttl_s: float = DEFAULT_IN_PROGRESS_TTL_S,
              ) -> AbstractAsyncContextManager[bool]:
        """``async with app.idempotent(key) as first:`` — True once per key within ``ttl_s``.

        Across every process sharing this app's storage, atomically under concurrent callers.
        A block that raises is forgotten (the next caller gets True); one that crashes holds
        the key for ``in_progress_ttl_s``. Needs only the storage, so it works outside
        ``serving()`` too (a web handler, a script).

        Raises :class:`ConfigError` at once for a bad key or duration, and
        :class:`~istos.errors.StorageUnavailable` on entry (nothing claimed) or on a normal exit
        (the side effect ran but could not be recorded: the claim then blocks the key until
        ``in_progress_ttl_s`` lapses).
        """
        check_ledger_key(key)
        ttl = _duration("ttl_s", ttl_s)
        hold = _duration("in_progress_ttl_s", in_progress_ttl_s)
        return self._claim(key, ttl, hold)

    @contextlib.asynccontextmanager
    async def _claim(self, key: str, ttl_s: float, hold_s: float) -> AsyncIterator[bool]:
        token = await self._try_claim(key, hold_s)
        if token is None:
            yield False
            return
        try:
            yield True
        except Exception:
            # The side effect failed: forget the attempt so a retry may try again. Cancellation
            # and crashes skip this on purpose (the effect may have happened): the claim lapses.
            await self._release(key, token)
            raise
        await self._mark_done(key, token, ttl_s)

    async def _try_claim(self, key: str, hold_s: float) -> str | None:
        """Win ``run|key`` and check nothing is done yet; the claim's token if so, else None."""
        now = self._clock.now()
        token = self._ids.new()
        record = _record(IN_PROGRESS, now, now + hold_s, self._holder, token)
        if not await self._storage.put_if_absent(NS, f"run|{key}", record,
                                                 now=now, expires_at=now + hold_s):
            return None
        done = await self._storage.get(NS, f"done|{key}")
        if done is not None and _live(done, now):
            # An earlier holder finished (and released the claim we just took): nothing to do.
            await self._storage.delete(NS, f"run|{key}")
            return None
        return token

    async def _mark_done(self, key: str, token: str, ttl_s: float) -> None:
        now = self._clock.now()
        record = _record(DONE, now, now + ttl_s, self._holder, token)
        # False here means a live `done` exists: a second holder (admitted after our claim
        # lapsed) finished first. Its record serves just as well.
        await self._storage.put_if_absent(NS, f"done|{key}", record,
                                          now=now, expires_at=now + ttl_s)
        await self._release(key, token)

    async def _release(self, key: str, token: str) -> None:
        """Delete the claim if it is still ours (not a later holder's, after ours lapsed)."""
        raw = await self._storage.get(NS, f"run|{key}")
        rec = None if raw is None else _decode(raw)
        if rec is not None and rec.get("tok") == token:
            await self._storage.delete(NS, f"run|{key}")

    async def status(self, key: str) -> str | None:
        """``"done"`` (within its TTL), ``"in_progress"`` (a live claim) or None for an
        idempotency key (``app.ledger_status``; serving or not). Raises :class:`ConfigError`
        for a bad key and :class:`StorageUnavailable` when the storage cannot be read."""
        check_ledger_key(key)
        now = self._clock.now()
        for leaf, state in (("done", DONE), ("run", IN_PROGRESS)):
            raw = await self._storage.get(NS, f"{leaf}|{key}")
            if raw is not None and _live(raw, now):
                return state
        return None

    async def purge_expired(self) -> int:
        """Delete every expired record; returns how many (``app.ledger_purge``). Scans the
        namespace: an admin task (run it from a schedule).

        Each candidate is read again just before its delete, because the scan may be old by
        then (a key re-claimed meanwhile holds a fresh record that must survive). The port has
        no compare-and-delete, so a rewrite landing between that read and the delete is lost.
        Raises :class:`StorageUnavailable` when the storage fails (records purged before it
        stay purged).
        """
        now = self._clock.now()
        purged = 0
        for name, raw in await self._storage.scan(NS):
            if _live(raw, now):
                continue
            fresh = await self._storage.get(NS, name)
            if fresh is not None and not _live(fresh, now):
                await self._storage.delete(NS, name)
                purged += 1
        return purged
