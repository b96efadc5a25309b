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
Reservations live in the owner's storage (namespace ``wf:{queue}``, key ``cb:{chord id}``)
and are deleted ``TOMBSTONE_TTL_S`` after their callback was accepted (a callback fired again
after a crash finds its reservation still there, or its job still held).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import msgpack

from ..core import workflow_meta as wf
from ..core.config import check_queue_name
from ..errors import ConfigError, InvalidJob

if TYPE_CHECKING:
    from ..owner.owner import QueueOwner

TOMBSTONE_TTL_S = 86_400.0


class CallbackReservations:
    """The chord callbacks one owner's queue expects (served as ``chord_reserve``)."""

    def __init__(self, owner: QueueOwner) -> None:
        self.owner = owner
        self.ns = f"wf:{owner.name}"
        self._used: deque[tuple[float, str]] = deque()

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
        storage = self.owner.storage
        if await storage.get(self.ns, f"cb:{chord}") is not None:
            return {"reserved": False}  # already (a retried request)
        await storage.put(self.ns, f"cb:{chord}", msgpack.packb({"used_at": None}))
        return {"reserved": True}

    async def op_expects(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``chord_expects`` (read): whether this queue reserved chord ``chord_id``'s
        callback; the member queue's owner asks before it opens the barrier."""
        raw = await self.owner.storage.get(self.ns, f"cb:{msg['chord_id']}")
        return {"reserved": raw is not None}

    async def check(self, job_id: str, entry: dict[str, Any]) -> None:
        """Accept the callback ``job_id`` (its meta already proven) only if reserved here."""
        storage, chord = self.owner.storage, entry["id"]
        raw = await storage.get(self.ns, f"cb:{chord}")
        if raw is None:
            raise InvalidJob(f"job {job_id!r}: queue {self.owner.name!r} holds no reservation "
                             f"for chord {chord!r}'s callback (app.chord makes one)")
        now = self.owner.node.clock.now()
        if msgpack.unpackb(raw).get("used_at") is None:
            await storage.put(self.ns, f"cb:{chord}", msgpack.packb({"used_at": now}))
            self._used.append((now, chord))
        while self._used and now - self._used[0][0] >= TOMBSTONE_TTL_S:
            _, old = self._used.popleft()
            await storage.delete(self.ns, f"cb:{old}")
