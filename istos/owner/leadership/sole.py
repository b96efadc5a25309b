"""One owner per non-HA queue on a mesh: a liveliness token announces it, a second refuses.

Two ``ha=False`` owners of one queue would both answer requests, so one claim could lease a
job on each (two leases, two runs). Before it binds its rpc key, an owner therefore looks for
the token ``{prefix}/own/{queue}/{stamp}-{node}`` of another owner; if there is one it refuses
to serve with :class:`~istos.errors.OwnerConflict` naming that node, and the first keeps
serving. It refuses even when that owner does not answer a ping (the message says so): a
frozen or cut-off owner keeps its token until Zenoh's link lease ends (~10 s) and may come
back, and two owners are worse than a restart that has to wait out the lease. (A process that
is killed on its host closes its links, so its token goes at once.) It then declares its own
token and looks again: two owners that started at the same moment (neither saw the other)
settle by the earlier ``(stamp, node)``, the later one refusing.
A running owner never yields; if it sees an earlier owner's token appear later (a partition
that healed with an owner on each side), it logs an error naming the node, as only an operator
can tell which one to stop. A token of this node's own id counts as its own (a restarted node),
so give every process its own node id (the default does). HA replicas use the election instead
(``election.py``).
"""

from __future__ import annotations

import logging
from typing import Any

from ... import codec, keys
from ...errors import IstosError, OwnerConflict
from ...node import Node
from ...transport.base import NoResponder

log = logging.getLogger("istos.owner")

LOOK_S = 1.0  # how long a liveliness query waits for tokens (it usually ends at once)


class SoleOwner:
    """The token of one non-HA owner; :meth:`claim` before serving, :meth:`release` after."""

    def __init__(self, node: Node, queue: str) -> None:
        self.node = node
        self.queue = queue
        self.expr = f"{node.prefix}/own/{queue}"
        self.candidate = ""
        self._token: Any = None
        self._watch: Any = None

    def _others(self, keys: list[str]) -> list[str]:
        """Candidates of other nodes among token keys (a restarted node's old token is its
        own, not a rival)."""
        mine = self.node.node_id
        out = []
        for key in keys:
            cand = key.rpartition("/")[2]
            if cand != self.candidate and cand.partition("-")[2] != mine:
                out.append(cand)
        return out

    async def claim(self) -> None:
        """Announce this owner, or raise OwnerConflict (nothing declared) if another serves."""
        transport = self.node.transport
        assert transport is not None
        self.candidate = f"{int(self.node.clock.now() * 1e6):020d}-{self.node.node_id}"
        rivals = self._others(await transport.liveliness_alive(f"{self.expr}/*", LOOK_S))
        if rivals:
            other = min(rivals).partition("-")[2]
            answered = await self._serving_node()
            raise OwnerConflict(
                f"queue {self.queue!r} is already owned by node {other!r} on this mesh "
                + ("(it answers requests)" if answered is not None else
                   "(its token is alive but it did not answer a ping: if it crashed or froze, "
                   "its token ends with Zenoh's link lease, ~10 s; start again then)")
                + "; a second owner of a queue declared without ha=True would lease its jobs "
                "twice. Stop one of them, or declare the queue with ha=True on both (shared "
                "storage)")
        self._token = await transport.declare_liveliness_token(f"{self.expr}/{self.candidate}")
        rivals = [c for c in self._others(
            await transport.liveliness_alive(f"{self.expr}/*", LOOK_S)) if c < self.candidate]
        if rivals:
            self.release()
            raise OwnerConflict(
                f"queue {self.queue!r}: node {min(rivals).partition('-')[2]!r} started to own it "
                "at the same moment and came first; a second owner of a queue declared "
                "without ha=True would lease its jobs twice")
        self._watch = await transport.watch_liveliness(f"{self.expr}/*", self._on_token)

    async def _serving_node(self) -> str | None:
        """The node that answers a ping on this queue now, if any (and not this one)."""
        transport = self.node.transport
        assert transport is not None
        key = keys.rpc_key(self.node.prefix, self.queue, "ping")
        ping, clock = codec.encode_message({"v": 1, "op": "ping"}), self.node.clock
        until = clock.monotonic() + LOOK_S
        while True:
            try:
                reply = codec.decode_message(await transport.query(key, ping, LOOK_S))
                break
            except NoResponder:  # its route may trail its token by a moment
                if clock.monotonic() >= until:
                    return None
                await clock.sleep(0.02)
            except IstosError:  # a timeout or an error reply: nobody serves it
                return None
        node = reply.get("node") if isinstance(reply, dict) and reply.get("ok") else None
        if not isinstance(node, str) or node == self.node.node_id:
            return None
        return node

    def _on_token(self, key: str, alive: bool) -> None:
        # Only an earlier owner's token: a later one is a newcomer that refuses by itself (the
        # owners of a healed partition see each other, so one of the two always logs).
        if alive and self._token is not None and \
                any(c < self.candidate for c in self._others([key])):
            log.error("queue %s: another owner (%s) serves it on this mesh too; two owners "
                      "of a non-HA queue lease jobs twice: stop one", self.queue,
                      key.rpartition("/")[2].partition("-")[2])

    def release(self) -> None:
        for handle in (self._watch, self._token):
            if handle is not None:
                handle.close()
        self._watch = self._token = None
