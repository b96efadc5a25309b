"""The bounded, durable history of published events, kept in the Storage port.

:mod:`istos.features.pubsub` appends a durable event here before sending it and reads it back
to let a durable subscriber catch up; it knows nothing of subscribers, transports or cursors.

Layout (namespace / key), so every process sharing a storage (memory, Redis, SQL) sees one
history per event key::

    events:{key} / {seq:020d}   one event record per number, zero-padded
    evhead       / {key}        {"seq": newest, "lo": oldest retained}: a hint, see History

An event record is the wire message of a durable event without its ``seq`` (the key holds it):
``{"v", "pub", "t": published at, "body": msgpack bytes, "exp": expires at}``.
:func:`_decode_event` reads both forms.

Guarantees: numbers of one key are never shared, even by publishers racing on one storage, and
the retained numbers form one contiguous run. The newest ``limit`` events (the caller's
``history_limit``) are kept; older ones are deleted as newer ones arrive. Expired entries are
deleted gradually from the old end, and readers must skip any they still find.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import codec
from ..errors import IstosError, ProtocolError

if TYPE_CHECKING:
    from ..storage.base import Storage

HEAD_NS = "evhead"  # per key: the newest number and oldest retained one (hints, see History)
_AGE_TRIM_STEPS = 2  # old entries a publish may delete: keeps up, since each publish adds one
_AGE_TRIM_KEEP = 32  # newest entries age trimming never touches (see History._trim_aged)
_ALLOC_ROUNDS = 64


@dataclass(frozen=True, slots=True)
class _Event:
    seq: int | None
    published_at: float
    body: bytes
    expires_at: float | None = None


def _decode_event(raw: bytes, seq: int | None = None) -> _Event:
    """Decode a wire message or history entry; ProtocolError if it is not one of ours."""
    msg = codec.decode_message(raw)
    try:
        number = msg.get("seq") if seq is None else seq
        exp = msg.get("exp")
        event = _Event(None if number is None else int(number), float(msg["t"]), msg["body"],
                       None if exp is None else float(exp))
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed event message: {exc!r}") from exc
    if not isinstance(event.body, bytes):
        raise ProtocolError("malformed event message: body is not bytes")
    return event


def _seq_key(seq: int) -> str:
    return f"{seq:020d}"


def _history_ns(key: str) -> str:
    return f"events:{key}"


@dataclass(slots=True)
class _Hint:
    last: int  # the newest number this node allocated or learned of
    floor: int  # the oldest number that may still be stored (age trimming resumes here)


class History:
    """The durable event history of one storage, and this node's hints for appending to it.

    Allocation: ``put_if_absent`` on number hint+1, moving up on conflict. Present entries form
    one contiguous run (trimming removes the oldest, appends extend the newest), so a claim is
    valid exactly when its predecessor is present; a claim whose predecessor is missing came from
    a hint left behind the trimmed end (this node idled while others published) and is taken back
    before anything was sent, and the hint resynchronised. The ``evhead`` record holds the newest
    number and oldest retained one; it is a hint (plain puts may land out of order), used to
    seed a fresh node and to skip trimmed ranges, never for correctness.
    """

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self._hints: dict[str, _Hint] = {}

    async def head(self, key: str) -> tuple[int, int] | None:
        """``(newest, oldest)`` numbers as last recorded, or None if nothing was published."""
        raw = await self.storage.get(HEAD_NS, key)
        if raw is None:
            return None
        msg = codec.decode_message(raw)
        try:
            return int(msg["seq"]), int(msg["lo"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"malformed event head record for {key!r}: {exc!r}") from exc

    async def read(self, key: str, seq: int) -> _Event | None:
        raw = await self.storage.get(_history_ns(key), _seq_key(seq))
        return None if raw is None else _decode_event(raw, seq)

    async def append(self, key: str, record: bytes, *, now: float, limit: int) -> int:
        """Store ``record`` under the next number of ``key`` and trim; returns the number.

        A bounded number of storage calls (two when uncontended, plus three or four for
        trimming, run concurrently). Raises :class:`IstosError` if contention keeps taking the
        next number for ``_ALLOC_ROUNDS`` tries, and the storage's errors as they come.
        """
        hint = self._hints.get(key)
        if hint is None:
            head = await self.head(key)
            hint = _Hint(*head) if head else _Hint(0, 1)
            self._hints[key] = hint
        seq = await self._allocate(key, record, hint, now)
        oldest = max(1, seq - limit + 1)
        hint.floor = max(hint.floor, oldest)
        record_head = {"v": codec.PROTOCOL_VERSION, "seq": seq, "lo": hint.floor}
        calls = [self.storage.put(HEAD_NS, key, codec.encode_message(record_head)),
                 self._trim_aged(key, seq, hint, now)]
        if seq > limit:
            calls.append(self.storage.delete(_history_ns(key), _seq_key(seq - limit)))
        await asyncio.gather(*calls)
        return seq

    async def _allocate(self, key: str, record: bytes, hint: _Hint, now: float) -> int:
        ns, storage = _history_ns(key), self.storage
        seq, conflicts = hint.last + 1, 0
        for _ in range(_ALLOC_ROUNDS):
            if not await storage.put_if_absent(ns, _seq_key(seq), record, now=now):
                # Taken: move past it, jumping to the recorded head when that is further (our
                # hint was old); after a streak, trust only what is actually stored.
                conflicts += 1
                seq = max(seq, await self._newest(key, scan=conflicts % 8 == 0)) + 1
                continue
            if seq == 1 or await storage.get(ns, _seq_key(seq - 1)) is not None:
                hint.last = max(hint.last, seq)
                return seq
            await storage.delete(ns, _seq_key(seq))
            seq = await self._newest(key, scan=True) + 1
        raise IstosError(f"could not allocate a sequence number for durable events on {key!r} "
                         f"in {_ALLOC_ROUNDS} tries; too many publishers racing on one key?")

    async def _newest(self, key: str, *, scan: bool) -> int:
        """The newest number: from the head record, or (``scan``) from the stored entries."""
        if not scan:
            head = await self.head(key)
            return 0 if head is None else head[0]
        numbers = [int(k) for k, _ in await self.storage.scan(_history_ns(key))]
        hint = self._hints[key]
        if numbers:
            hint.floor = max(hint.floor, min(numbers))
        return max(numbers, default=0)

    async def _trim_aged(self, key: str, seq: int, hint: _Hint, now: float) -> None:
        """Delete up to ``_AGE_TRIM_STEPS`` expired entries from the old end.

        The newest ``_AGE_TRIM_KEEP`` entries are never deleted for age: a publisher that just
        claimed a number checks its predecessor, and deleting that under it would make it take
        its (valid) number back. Readers skip expired entries anyway.
        """
        ns = _history_ns(key)
        for _ in range(_AGE_TRIM_STEPS):
            floor = hint.floor
            if floor >= seq - _AGE_TRIM_KEEP:
                return
            raw = await self.storage.get(ns, _seq_key(floor))
            if raw is not None:
                try:
                    exp = _decode_event(raw, floor).expires_at
                except ProtocolError:
                    exp = now  # an unreadable entry is nobody's: let it go
                if exp is None or exp > now:
                    return
                await self.storage.delete(ns, _seq_key(floor))
            hint.floor = max(hint.floor, floor + 1)
