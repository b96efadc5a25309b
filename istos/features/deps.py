"""Dependencies: jobs that wait for others (``enqueue(..., after=[...])``), wired into an app.

The rules are in ``core/deps.py``, the producer's half (watch each parent, then enqueue) in
``client/deps.py`` and the owners' halves (waiting children, watched parents) in
``owner/extensions/deps_ext.py``; this module installs the owner side on each of an app's
owners and routes each owner's events to it.

Dependencies are one concept at three layers: the rules (``core/deps.py``), the producer's
half (``client/deps.py``) and this wiring.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..events import OWNER_UP
from ..owner.extensions.deps_ext import ROUTED, DepsOwner

if TYPE_CHECKING:
    from ..client import OwnerClient
    from ..events import JobEvent
    from ..node import Node
    from ..owner.handle import OwnerHandle


class Dependencies:
    """The owner side of dependencies for one app: :meth:`owner_extension` per owner."""

    def __init__(self, node: Node, client: Callable[[str], OwnerClient]) -> None:
        self.client = client
        self._owners: dict[str, DepsOwner] = {}
        node.events.subscribe(self._route, ROUTED)

    def owner_extension(self, owner: OwnerHandle) -> DepsOwner:
        """Serve dependencies on ``owner`` (child and parent sides)."""

        async def call(queue: str, op: str, **fields: Any) -> dict[str, Any]:
            return await self.client(queue).call(op, **fields)

        ext = DepsOwner(owner, call)
        self._owners[owner.name] = ext  # a restarted owner's extension replaces the old one
        return ext

    def _route(self, event: JobEvent) -> None:
        if event.kind not in ROUTED:
            return
        ext = self._owners.get(event.queue)
        if ext is not None and ext.owner.running and (ext.watches or event.kind == OWNER_UP):
            ext.on_event(event)  # (an end nobody watches, the common case, stops here)
