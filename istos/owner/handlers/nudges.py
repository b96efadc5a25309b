"""An owner's nudges: telling idle workers that jobs became claimable.

Coalesced per loop turn, and sent only to as many of the hungry nodes (those whose last claim
left slots empty, :class:`~istos.core.hungry.HungryNodes`) as there are new jobs: the
extensions' ``on_nudge`` hooks first (the app's in-process workers), then one message on
``{prefix}/q/{queue}/nudge`` naming the remote ones, except those an absorber (parked claims,
``extensions/parking.py``) answered itself.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from ... import codec
from ...core.hungry import HungryNodes
from ...node import Node
from ..extension import OwnerExtension

Absorber = Callable[[set[str]], set[str]]
"""Given the nodes about to be nudged, wakes what it can itself; returns the nodes it woke."""


class Nudges:
    def __init__(self, node: Node, queue: str, hungry: HungryNodes,
                 listeners: list[OwnerExtension], running: Callable[[], bool]) -> None:
        self.node, self.queue, self.hungry = node, queue, hungry
        self.listeners = listeners  # the owner's list of on_nudge extensions (shared)
        self._running = running
        self._absorbers: list[Absorber] = []
        self._count = 0
        self._targets: set[str] = set()  # chosen already this turn (with absorbers)
        self._absorbed: set[str] = set()  # ...and woken by an absorber: no message for them
        self._scheduled = False

    def add_absorber(self, absorber: Absorber) -> None:
        """From now on, hand the nodes chosen for each nudge to ``absorber`` too."""
        self._absorbers.append(absorber)

    def nudge(self, count: int) -> None:
        """Tell idle workers that ``count`` jobs became claimable; coalesced per loop turn.

        With absorbers (parked claims), the nodes to wake are chosen at once and the
        absorbers wake theirs now, so a parked claim is answered in the next loop step rather
        than after the turn's end; the hooks and the message still go out once per turn."""
        if count > 0 and self._absorbers and self._running():
            targets = self.hungry.take(count)
            if targets:  # (none: no worker is waiting for work)
                remote = targets - {self.node.node_id}
                for absorb in self._absorbers:
                    if remote:
                        woken = absorb(remote)
                        self._absorbed |= woken
                        remote -= woken
                self._targets |= targets
        else:
            self._count += count
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        count, self._count, self._scheduled = self._count, 0, False
        chosen, self._targets = self._targets, set()
        absorbed, self._absorbed = self._absorbed, set()
        if not self._running():
            return
        targets = chosen | self.hungry.take(count)
        if not targets:
            return
        for ext in self.listeners:
            ext.on_nudge(len(targets), targets)
        node = self.node
        remote = targets - {node.node_id} - absorbed
        for absorb in self._absorbers:  # (nodes chosen at the turn's end: pokes)
            if remote:
                remote -= absorb(remote)
        if remote and node.transport is not None:
            payload = codec.encode_message({"v": codec.PROTOCOL_VERSION, "to": sorted(remote)})
            asyncio.get_running_loop().create_task(
                node.transport.put(node.key(self.queue, "nudge"), payload))
