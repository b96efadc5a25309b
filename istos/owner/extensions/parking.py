"""Parked claims: an idle worker's claim waits at the owner until a job is claimable.

One concept at three layers: parked claims' owner side here, the worker's side in
``worker/parking.py``, the request's in ``client/parking.py``.

Without parking, an idle worker pays three messages before a job starts (enqueue, nudge, claim);
a parked claim is answered the moment a job becomes claimable, one hop after the enqueue (the
long poll of SQS ``WaitTimeSeconds`` and of Redis ``BLPOP``, here bounded by the worker).

A claim asks to park with ``park_s`` (seconds, at most :data:`~istos.protocol.MAX_PARK_S`; the
worker sends its poll interval). It is parked only when it came back with no job, no
cancellation to tell and nothing cut short; its piggybacked acks were already settled and
written, and its reply, when it comes, carries their statuses. A parked claim ends:

- when the owner nudges its node (jobs became claimable, ``handlers/nudges.py``): the claim is run
  again for the same slots, through the ordinary claim path, so a job is leased exactly as by any
  claim (once, to one slot); if another worker took the jobs first it stays parked;
- at its bound, with the empty reply;
- when a newer claim from the same slots and with the same ``park_key`` arrives (the worker's
  retry after a lost reply) or the worker sends ``unpark`` with that key (it is stopping): with
  the empty reply, at once;
- when the owner stops (or steps down): with the empty reply marked ``unparked``, so the worker
  claims again at once, from whoever owns the queue now.

Queues with durable storage do not park (their claims are answered at once, and their workers
wait for nudges): a parked claim leases each job the moment it is stored, one claim write per
job, where a nudged worker's claim arriving a round trip later takes what came meanwhile in one;
measured, that cost durable end-to-end throughput a third (``bench.durable --twoproc-only``).

A claim parks only with a ``park_key``: a secret its worker drew from its node's id source and
sends only with its own claims and unparks. Slot and node ids are no proof (the ``workers``
read op shows them): a claim naming a parked slot with another key is answered at once and
leaves the parked claim alone, and an unpark without the key ends nothing.

Replies of claims that parked say ``parked: true``; a worker that sees none (an owner without
this extension, or a full table) falls back to waiting for a nudge or its poll interval.
Parked claims are bounded (:data:`MAX_PARKED` per queue; past it a claim is answered at once),
since claims name nodes the owner cannot verify.

A worker that dies while parked (``kill -9``, a crash) would leave its claim until the bound,
and a job arriving meanwhile would be leased to a process that is gone: it would come back only
at lease expiry, and that expiry would count as an attempt. So a node whose workers park
declares a liveliness token per queue (``Node.worker_token_key``) while it serves, and the
owner watches them: when a node's token goes away (its Zenoh session ended: a killed process's
TCP link closes at once; a frozen or cut-off one's after the link lease), its parked claims end
at once, unanswered by any job, and until its token is back a claim from it is answered at once
rather than parked (one sent just before the kill may arrive after it). Why not the other
ways: Zenoh does not tell a replier that its querier is gone (a reply to a dead query is
simply dropped), and not counting an attempt until the worker confirms it would let a job
that kills its worker (a poison pill) retry forever, or one whose confirmation was lost run
twice uncounted. What is left: a job that arrives between the kill and the moment the owner
sees the token go (milliseconds on a local link) is still leased to the dead claim, and a
worker that declares no token (an older one) parks as before.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ... import protocol
from ...transport.base import TransportError
from ..extension import Handler, OwnerExtension, not_wrapped

if TYPE_CHECKING:  # (only the type: the owner does not import this module)
    from ..handle import OwnerHandle

log = logging.getLogger("istos.owner")

MAX_PARKED = 1024
"""Parked claims one owner holds at once; a claim past it is answered at once, unparked."""
MAX_GONE = 4096
"""Nodes remembered as gone (their token went away and has not come back), oldest forgotten."""


class _Parked:
    __slots__ = ("node", "key", "woken")

    def __init__(self, node: str, key: str, loop: asyncio.AbstractEventLoop) -> None:
        self.node = node
        self.key = key  # the worker's secret: only it may supersede or unpark this claim
        # "jobs", "bound", "drop" (superseded, unparked), "gone" (its token went), "stop"
        self.woken: asyncio.Future[str] = loop.create_future()

    def wake(self, why: str) -> None:
        if not self.woken.done():
            self.woken.set_result(why)


class ParkedClaims(OwnerExtension):
    """Wraps the owner's ``claim`` op (outermost: a parked claim, when woken, runs again
    through every other claim wrapper) and serves ``unpark``; hooks into the owner's nudges
    to answer parked claims of nudged nodes."""

    name = "parking"
    serves = ("unpark",)
    wraps = ("claim",)

    def __init__(self, owner: OwnerHandle) -> None:
        self.owner = owner
        self._claim: Handler = not_wrapped
        self.parked: dict[str, _Parked] = {}  # by the claim's first slot id
        self.stats = {"parked": 0, "answered_by_job": 0, "expired": 0, "dropped": 0,
                      "worker_gone": 0}
        self.gone: dict[str, None] = {}  # nodes whose worker token went away (ordered: oldest)
        owner.absorb_nudges(self.wake_nodes)
        self._watch: Any = None
        self._stopped = False
        self._watching = asyncio.get_running_loop().create_task(self._watch_tokens())

    async def _watch_tokens(self) -> None:
        node = self.owner.node
        if node.transport is None:
            return
        expr = node.worker_token_key(self.owner.name)
        try:
            handle = await node.transport.watch_liveliness(expr, self._on_token)
        except TransportError as exc:  # parking still works: only a dead worker's claim waits
            log.warning("queue %s: not watching worker tokens: %s", self.owner.name, exc)
            return
        if self._stopped:
            handle.close()
        else:
            self._watch = handle

    def _on_token(self, key: str, alive: bool) -> None:
        base = self.owner.node.worker_token_key(self.owner.name, "")
        if not key.startswith(base):
            return
        node = key[len(base):]
        if alive:
            self.gone.pop(node, None)
            return
        self.gone[node] = None
        if len(self.gone) > MAX_GONE:
            del self.gone[next(iter(self.gone))]
        for entry in list(self.parked.values()):
            if entry.node == node:
                self.stats["worker_gone"] += 1
                entry.wake("gone")

    def ops(self) -> Mapping[str, Handler]:
        return {"unpark": self.op_unpark}

    def wrap(self, op: str, inner: Handler) -> Handler:
        self._claim = inner
        return self.op_claim

    async def op_claim(self, msg: dict[str, Any]) -> dict[str, Any]:
        reply = await self._claim(msg)
        park_s = min(float(msg.get("park_s") or 0.0), protocol.MAX_PARK_S)
        key = msg.get("park_key")
        if park_s <= 0 or reply["jobs"] or reply.get("cancel") or reply.get("more") \
                or not isinstance(key, str) or not self.owner.running or self.owner.durable:
            # (No key, no parking: a claim that cannot prove it is the one that parked could
            # not be told apart from another's, and the worker waits for nudges instead.)
            # (Durable queues do not park: measured, a job leased the moment it is stored
            # makes one claim write per job where nudged claims batch them, bench.durable.)
            return reply
        if self.gone and (msg.get("node") or "") in self.gone:
            return reply  # its process is gone (or cut off): nobody would run what it got
        slot: str = msg["workers"][0]
        old = self.parked.get(slot)
        if old is not None:
            if not _same(old.key, key):
                return reply  # another's parked claim on that slot: it stays, this one waits
            del self.parked[slot]
            old.wake("drop")  # superseded: its worker stopped waiting for it
        elif len(self.parked) >= MAX_PARKED:
            return reply
        return await self._park(msg, slot, key, park_s, reply)

    async def _park(self, msg: dict[str, Any], slot: str, key: str, park_s: float,
                    reply: dict[str, Any]) -> dict[str, Any]:
        owner = self.owner
        clock = owner.node.clock
        loop = asyncio.get_running_loop()
        deadline = clock.monotonic() + park_s
        again = {"workers": msg["workers"], "node": msg.get("node") or ""}
        self.stats["parked"] += 1
        while True:
            entry = _Parked(again["node"], key, loop)
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
                if why != "gone":
                    self.stats["expired" if why == "bound" else "dropped"] += 1
                return reply
            # The leases below start after this wait: the worker counts them from its send
            # time plus it (not from its send time alone, which could be a whole park ago).
            waited = max(0.0, clock.monotonic() - (deadline - park_s))
            fresh = await self._claim(again)
            if fresh["jobs"] or fresh.get("cancel") or clock.monotonic() >= deadline \
                    or not owner.running:
                self.stats["answered_by_job"] += bool(fresh["jobs"])
                if "settled" in reply:
                    fresh["settled"] = reply["settled"]
                fresh["parked"] = True
                fresh["waited_s"] = waited
                return fresh
            # Another claim took the jobs first: wait on, to the same bound.

    async def op_unpark(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A stopping worker's parked claims (by their ``workers``, proven by the
        ``park_key`` they parked with) end now, with no job."""
        dropped, key = 0, msg.get("park_key")
        if not isinstance(key, str):
            return {"unparked": 0}  # nothing proves whose claims these are
        for slot in msg["workers"]:
            entry = self.parked.get(slot)
            if entry is not None and _same(entry.key, key):
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
        self._stopped = True
        self._watching.cancel()
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        for entry in list(self.parked.values()):
            self.stats["dropped"] += 1
            entry.wake("stop")


def _same(held: str, given: str) -> bool:
    """Whether ``given`` is the parked claim's key (in constant time: it is a secret)."""
    return hmac.compare_digest(held.encode(), given.encode())
