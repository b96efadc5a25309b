"""The callback side of a chord: a reservation its opener makes on the callback queue.

A chord's barrier lives on the member queue's owner, which enqueues the callback when the last
member is acked. Without more, that owner would be a confused deputy: it enqueues with its own
rights on whatever queue the opener named. So ``app.chord`` first sends ``chord_reserve`` to
the *callback* queue's owner, on that queue's ``produce`` key: the same access-control grant
an ``enqueue`` there needs, so only an opener that may enqueue on the callback queue gets a
reservation (docs/security/README.md). The callback queue's owner then accepts the callback
job (``{chord id}.callback``, with the chord's key in its meta) only for a chord it reserved.

The reservation is checked against the chord id like every workflow job
(:mod:`istos.core.workflow_meta`): the id is derived from the chord's key, member queue, size
and this callback queue, so a reservation cannot be made for a chord one only read about.
Reservations live in the owner's storage (namespace ``wf:{queue}``, key ``cb:{chord id}``),
written through the owner's write path (with an HA leader's fence),
and are deleted ``TOMBSTONE_TTL_S`` after their callback was accepted (a callback fired again
after a crash finds its reservation still there, or its job still held).

Anyone who may enqueue on the queue may reserve, with keys of their choosing, so unused
reservations are bounded: one expires ``RESERVE_TTL_S`` after it was made (a chord whose
members take longer loses its callback: the last member's ack is answered ``error`` and the
member dead-letters), and a queue holds at most ``MAX_RESERVATIONS`` unused ones (past it,
``chord_reserve`` is answered :class:`CapacityExceeded`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgpack

from ..core import workflow_meta as wf
from ..core.config import check_queue_name
from ..errors import CapacityExceeded, ConfigError, InvalidJob, OwnerUnavailable

if TYPE_CHECKING:
    from ..owner.handle import OwnerHandle

TOMBSTONE_TTL_S = 86_400.0
RESERVE_TTL_S = 7 * 86_400.0  # an unused reservation's life
MAX_RESERVATIONS = 16_384  # unused reservations one queue holds
EXPIRE_PER_CALL = 256  # expired reservations deleted per chord_reserve (bounded work)


class CallbackReservations:
    """The chord callbacks one owner's queue expects (served as ``chord_reserve``)."""

    def __init__(self, owner: OwnerHandle) -> None:
        self.owner = owner
        self.ns = f"wf:{owner.name}"
        self._used: deque[tuple[float, str]] = deque()
        # Unused reservations by chord id -> made at, oldest first; None until read from
        # storage (once per owner life, so those of an earlier owner expire too).
        self._unused: dict[str, float] | None = None

    async def _index(self) -> dict[str, float]:
        if self._unused is None:
            now, found = self.owner.node.clock.now(), []
            for key, raw in await self.owner.storage.scan(self.ns):
                if key.startswith("cb:"):
                    entry = msgpack.unpackb(raw)
                    if entry.get("used_at") is None:
                        made = entry.get("made_at")
                        found.append((made if isinstance(made, float) else now, key[3:]))
            if self._unused is None:  # (another request may have loaded it meanwhile)
                self._unused = dict((chord, t) for t, chord in sorted(found))
        return self._unused

    async def _expire(self, unused: dict[str, float], now: float) -> None:
        """Delete up to ``EXPIRE_PER_CALL`` unused reservations past their life (from
        storage first: memory follows only a write that succeeded)."""
        for _ in range(EXPIRE_PER_CALL):
            oldest = next(iter(unused.items()), None)
            if oldest is None or now - oldest[1] < RESERVE_TTL_S:
                return
            await self.owner.writes.delete_aux(self.ns, f"cb:{oldest[0]}")
            unused.pop(oldest[0], None)

    async def op_reserve(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``chord_reserve``: expect the callback of chord ``chord_id`` (members on
        ``member_queue``, ``size`` of them, started with ``key``) on this queue."""
        chord, queue, size = msg["chord_id"], msg["member_queue"], msg["size"]
        try:
            check_queue_name(queue)
        except ConfigError as exc:
            raise InvalidJob(f"chord_reserve: member_queue {exc}") from None
        key = wf.check_key(chord, msg["key"])
        if chord != wf.chord_id(key, queue, size, self.owner.name):
            raise InvalidJob(f"chord_reserve: {chord!r} is not the id of a chord with that key, "
                             f"member queue and size whose callback queue is "
                             f"{self.owner.name!r}")
        storage, now = self.owner.storage, self.owner.node.clock.now()
        unused = await self._index()
        await self._expire(unused, now)
        if await storage.get(self.ns, f"cb:{chord}") is not None:
            return {"reserved": False}  # already (a retried request)
        if len(unused) >= MAX_RESERVATIONS:
            raise CapacityExceeded(
                f"chord_reserve: queue {self.owner.name!r} holds {len(unused)} unused chord "
                f"reservations, the most it may (each expires {RESERVE_TTL_S:g} s after it "
                "was made, or once its callback is enqueued): try again later")
        await self.owner.writes.put_aux(self.ns, f"cb:{chord}",
                                        msgpack.packb({"used_at": None, "made_at": now}))
        unused[chord] = now
        return {"reserved": True}

    def _expired(self, entry: dict[str, Any], now: float) -> bool:
        made = entry.get("made_at")
        return entry.get("used_at") is None and isinstance(made, float) \
            and now - made >= RESERVE_TTL_S

    async def op_expects(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``chord_expects`` (read): whether this queue reserved chord ``chord_id``'s
        callback (and the reservation has not expired); the member queue's owner asks before
        it opens the barrier."""
        raw = await self.owner.storage.get(self.ns, f"cb:{msg['chord_id']}")
        now = self.owner.node.clock.now()
        return {"reserved": raw is not None and not self._expired(msgpack.unpackb(raw), now)}

    async def check(self, job_id: str, entry: dict[str, Any]) -> None:
        """Accept the callback ``job_id`` (its meta already proven) only if reserved here."""
        storage, chord = self.owner.storage, entry["id"]
        raw = await storage.get(self.ns, f"cb:{chord}")
        if raw is None:
            raise InvalidJob(f"job {job_id!r}: queue {self.owner.name!r} holds no reservation "
                             f"for chord {chord!r}'s callback (app.chord makes one)")
        now, entry = self.owner.node.clock.now(), msgpack.unpackb(raw)
        if self._expired(entry, now):
            raise InvalidJob(f"job {job_id!r}: queue {self.owner.name!r}'s reservation for "
                             f"chord {chord!r}'s callback expired (unused for "
                             f"{RESERVE_TTL_S:g} s)")
        if entry.get("used_at") is None:
            await self.owner.writes.put_aux(self.ns, f"cb:{chord}",
                                            msgpack.packb({"used_at": now}))
            self._used.append((now, chord))
            if self._unused is not None:
                self._unused.pop(chord, None)
        while self._used and now - self._used[0][0] >= TOMBSTONE_TTL_S:
            _, old = self._used.popleft()
            await self.owner.writes.delete_aux(self.ns, f"cb:{old}")


MAX_ASKING_PER_QUEUE = 4  # chord_expects queries one owner has in flight to one callback queue
MAX_ASKING = 64  # ... to all callback queues together
UNANSWERED_S = 5.0  # how long a callback queue whose owner did not answer is not asked again
MAX_UNANSWERED = 1024  # callback queues remembered as unanswered (names come from requests)

Ask = Callable[[str, str], Awaitable[dict[str, Any]]]  # (callback queue, chord id) -> reply


class ExpectsAsker:
    """The member queue's side of ``chord_open``: asking the callback queue's owner whether it
    expects the chord, with the outbound cost bounded. Callback queue names come from the
    request, so a producer naming a queue nobody serves must not make this owner retry queries
    without end: at most :data:`MAX_ASKING_PER_QUEUE` queries to one queue and
    :data:`MAX_ASKING` in all are in flight (past that, :class:`OwnerUnavailable` at once),
    and a queue whose owner did not answer is not asked again for :data:`UNANSWERED_S`."""

    def __init__(self, ask: Ask, monotonic: Callable[[], float]) -> None:
        self._ask, self._monotonic = ask, monotonic
        self._asking: dict[str, int] = {}
        self._in_flight = 0
        self._unanswered: dict[str, float] = {}  # queue -> not asked again until (oldest first)

    async def expects(self, callback: str, chord_id: str) -> bool:
        """Whether ``callback``'s owner holds a reservation for ``chord_id``. Raises
        :class:`OwnerUnavailable` when it did not answer (now, or lately) or too many queries
        wait already."""
        now = self._monotonic()
        until = self._unanswered.get(callback)
        if until is not None:
            if now < until:
                raise OwnerUnavailable(f"chord_open: the owner of callback queue {callback!r} "
                                       f"did not answer lately; try again in {until - now:.1f} s")
            del self._unanswered[callback]
        asking = self._asking.get(callback, 0)
        if asking >= MAX_ASKING_PER_QUEUE or self._in_flight >= MAX_ASKING:
            raise OwnerUnavailable(f"chord_open: {asking} queries to the owner of callback queue "
                                   f"{callback!r} ({self._in_flight} in all) wait already; try "
                                   "again later")
        self._asking[callback] = asking + 1
        self._in_flight += 1
        try:
            reply = await self._ask(callback, chord_id)
        except OwnerUnavailable:
            self._unanswered.pop(callback, None)
            self._unanswered[callback] = self._monotonic() + UNANSWERED_S
            while len(self._unanswered) > MAX_UNANSWERED:
                del self._unanswered[next(iter(self._unanswered))]
            raise
        finally:
            self._in_flight -= 1
            left = self._asking[callback] - 1
            if left:
                self._asking[callback] = left
            else:
                del self._asking[callback]
        return reply.get("reserved") is True
