"""Parked claims: an idle worker's claim waits at the owner until a job is claimable.

Without parking, an idle worker pays three messages before a job starts (enqueue, nudge, claim);
a parked claim is answered the moment a job becomes claimable, one hop after the enqueue (the
long poll of SQS ``WaitTimeSeconds`` and of Redis ``BLPOP``, here bounded by the worker).

A claim asks to park with ``park_s`` (seconds, at most :data:`~istos.protocol.MAX_PARK_S`; the
worker sends its poll interval). It is parked only when it came back with no job, no
cancellation to tell and nothing cut short; its piggybacked acks were already settled and
written, and its reply, when it comes, carries their statuses. A parked claim ends:

- when the owner nudges its node (jobs became claimable, ``nudges.py``): the claim is run again
  for the same slots, through the ordinary claim path, so a job is leased exactly as by any
  claim (once, to one slot); if another worker took the jobs first it stays parked;
- at its bound, with the empty reply;
- when a newer claim from the same slots arrives (the worker's retry after a lost reply) or the
  worker sends ``unpark`` (it is stopping): with the empty reply, at once;
- when the owner stops (or steps down): with the empty reply marked ``unparked``, so the worker
  claims again at once, from whoever owns the queue now.

Queues with durable storage do not park (their claims are answered at once, and their workers
wait for nudges): a parked claim leases each job the moment it is stored, one claim write per
job, where a nudged worker's claim arriving a round trip later takes what came meanwhile in one;
measured, that cost durable end-to-end throughput a third (``bench.durable --twoproc-only``).

Replies of claims that parked say ``parked: true``; a worker that sees none (an owner without
this extension, or a full table) falls back to waiting for a nudge or its poll interval.
Parked claims are bounded (:data:`MAX_PARKED` per queue; past it a claim is answered at once),
since claims name nodes the owner cannot verify. A worker that crashes while parked leaves its
claim until the bound: a job arriving meanwhile is leased to it and comes back at lease expiry,
as a crashed worker's prefetched job does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .. import protocol
from .extension import Handler, OwnerExtension

if TYPE_CHECKING:  # (only the type: the owner does not import this module)
    from .owner import QueueOwner

MAX_PARKED = 1024
"""Parked claims one owner holds at once; a claim past it is answered at once, unparked."""


class _Parked:
    __slots__ = ("node", "woken")

    def __init__(self, node: str, loop: asyncio.AbstractEventLoop) -> None:
        self.node = node
        self.woken: asyncio.Future[str] = loop.create_future()  # "jobs", "drop", "stop"

    def wake(self, why: str) -> None:
        if not self.woken.done():
            self.woken.set_result(why)


class ParkedClaims(OwnerExtension):
    """Wraps the owner's ``claim`` op (install it after every other claim wrapper) and serves
    ``unpark``; hooks into the owner's nudges to answer parked claims of nudged nodes."""

    def __init__(self, owner: QueueOwner) -> None:
        self.owner = owner
        claim = owner.handler("claim")
        assert claim is not None  # the owner's own op
        self._claim = claim
        self.parked: dict[str, _Parked] = {}  # by the claim's first slot id
        self.stats = {"parked": 0, "answered_by_job": 0, "expired": 0, "dropped": 0}
        owner.nudges.absorbers.append(self.wake_nodes)

    def ops(self) -> Mapping[str, Handler]:
        return {"claim": self.op_claim, "unpark": self.op_unpark}

    async def op_claim(self, msg: dict[str, Any]) -> dict[str, Any]:
        reply = await self._claim(msg)
        park_s = min(float(msg.get("park_s") or 0.0), protocol.MAX_PARK_S)
        if park_s <= 0 or reply["jobs"] or reply.get("cancel") or reply.get("more") \
                or not self.owner.running or self.owner.durable:
            # (Durable queues do not park: measured, a job leased the moment it is stored
            # makes one claim write per job where nudged claims batch them, bench.durable.)
            return reply
        slot: str = msg["workers"][0]
        old = self.parked.pop(slot, None)
        if old is not None:
            old.wake("drop")  # superseded: its worker stopped waiting for it
        elif len(self.parked) >= MAX_PARKED:
            return reply
        return await self._park(msg, slot, park_s, reply)

    async def _park(self, msg: dict[str, Any], slot: str, park_s: float,
                    reply: dict[str, Any]) -> dict[str, Any]:
        owner = self.owner
        clock = owner.node.clock
        loop = asyncio.get_running_loop()
        deadline = clock.monotonic() + park_s
        again = {"workers": msg["workers"], "node": msg.get("node") or ""}
        self.stats["parked"] += 1
        while True:
            entry = _Parked(again["node"], loop)
            self.parked[slot] = entry
            timer = loop.call_later(clock.to_loop_seconds(max(0.0, deadline - clock.monotonic())),
                                    entry.wake, "bound")
            try:
                why = await entry.woken
            finally:
                timer.cancel()
                if self.parked.get(slot) is entry:
                    del self.parked[slot]
            if why == "stop":
                reply["unparked"] = "owner stopped"
                return reply
            reply["parked"] = True
            if why != "jobs":
                self.stats["expired" if why == "bound" else "dropped"] += 1
                return reply
            fresh = await self._claim(again)
            if fresh["jobs"] or fresh.get("cancel") or clock.monotonic() >= deadline \
                    or not owner.running:
                self.stats["answered_by_job"] += bool(fresh["jobs"])
                if "settled" in reply:
                    fresh["settled"] = reply["settled"]
                fresh["parked"] = True
                return fresh
            # Another claim took the jobs first: wait on, to the same bound.

    async def op_unpark(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A stopping worker's parked claims (by their ``workers``) end now, with no job."""
        dropped = 0
        for slot in msg["workers"]:
            entry = self.parked.get(slot)
            if entry is not None and entry.node == (msg.get("node") or ""):
                entry.wake("drop")
                dropped += 1
        return {"unparked": dropped}

    def wake_nodes(self, targets: set[str]) -> set[str]:
        """The owner is nudging ``targets``: answer their parked claims; returns the nodes
        woken here (they need no nudge message)."""
        woken: set[str] = set()
        if not self.parked:
            return woken
        for entry in list(self.parked.values()):
            if entry.node in targets:
                entry.wake("jobs")
                woken.add(entry.node)
        return woken

    def on_stop(self) -> None:
        """Answer every parked claim now (if the transport is still open: closing it fails
        them instead, which the worker takes the same way)."""
        for entry in list(self.parked.values()):
            self.stats["dropped"] += 1
            entry.wake("stop")
