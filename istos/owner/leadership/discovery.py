"""Discovery: every owner announces its queue on the mesh, so operators find every queue under
a prefix with one liveliness query on a wildcard key, and no registry to run.

One concept at two sides: announcing the queue here (the owner's), finding every queue in
``ops/discovery.py`` (the operator's).

The owner declares a liveliness token ``{prefix}/dir/{queue}/{node_id}`` while it serves (an HA
standby does not: it serves nothing; its election token ``{prefix}/ha/{queue}/{candidate}``
says it is there). A token drops when its owner stops or its process dies, so the directory is
never stale for longer than Zenoh takes to notice a dead session.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ...transport.base import TransportError
from ..extension import OwnerExtension
from ..handle import OwnerHandle

log = logging.getLogger("istos.owner")

DIR = "dir"


def directory_key(prefix: str, queue: str, node_id: str) -> str:
    return f"{prefix}/{DIR}/{queue}/{node_id}"


class Announce(OwnerExtension):
    """Holds the owner's directory token from its setup until it stops."""

    name = "announce"

    def __init__(self, owner: OwnerHandle) -> None:
        self.owner = owner
        self._handle: Any = None
        self._stopped = False
        self._task = asyncio.get_running_loop().create_task(self._declare())

    async def _declare(self) -> None:
        node, transport = self.owner.node, self.owner.node.transport
        if transport is None:
            return
        try:
            handle = await transport.declare_liveliness_token(
                directory_key(node.prefix, self.owner.name, node.node_id))
        except TransportError as exc:  # discovery is a convenience: serving goes on
            log.warning("queue %s: not announced for discovery: %s", self.owner.name, exc)
            return
        if self._stopped:
            handle.close()
        else:
            self._handle = handle

    def on_stop(self) -> None:
        self._stopped = True
        self._task.cancel()
        if self._handle is not None:
            self._handle.close()
            self._handle = None
