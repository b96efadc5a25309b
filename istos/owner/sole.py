"""One owner per non-HA queue on a mesh: a liveliness token announces it, a second refuses.

Two ``ha=False`` owners of one queue would both answer requests, so one claim could lease a
job on each (two leases, two runs). Before it binds its rpc key, an owner therefore looks for
the token ``{prefix}/own/{queue}/{stamp}-{node}`` of another owner; if there is one it refuses
to serve with :class:`~istos.errors.OwnerConflict` naming that node, and the first keeps
serving. It then declares its own token and looks again: two owners that started at the same
moment (neither saw the other) settle by the earlier ``(stamp, node)``, the later one refusing.
A running owner never yields; if it sees another owner's token appear later (a partition that
healed with an owner on each side), it logs an error naming the node, as only an operator can
tell which one to stop. HA replicas use the election instead (``election.py``).
"""

from __future__ import annotations

import logging
from typing import Any

from ..errors import OwnerConflict
from ..node import Node

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
        if not rivals:
            self._token = await transport.declare_liveliness_token(
                f"{self.expr}/{self.candidate}")
            rivals = [c for c in self._others(
                await transport.liveliness_alive(f"{self.expr}/*", LOOK_S)) if c < self.candidate]
        if rivals:
            self.release()
            other = min(rivals).partition("-")[2]
            raise OwnerConflict(
                f"queue {self.queue!r} is already served by node {other!r} on this mesh; a "
                "second owner of a queue declared without ha=True would lease its jobs twice. "
                "Stop one of them, or declare the queue with ha=True on both (shared storage)")
        self._watch = await transport.watch_liveliness(f"{self.expr}/*", self._on_token)

    def _on_token(self, key: str, alive: bool) -> None:
        if alive and self._token is not None and self._others([key]):
            log.error("queue %s: another owner (%s) serves it on this mesh too; two owners "
                      "of a non-HA queue lease jobs twice: stop one", self.queue,
                      key.rpartition("/")[2].partition("-")[2])

    def release(self) -> None:
        for handle in (self._watch, self._token):
            if handle is not None:
                handle.close()
        self._watch = self._token = None
