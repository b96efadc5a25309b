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
        self._events = node.events
        self._owners: dict[str, DepsOwner] = {}
        # An owner coming up recovers its watches; job ends matter only once a parent is
        # watched, so that subscription waits for the first watch (_watching).
        node.events.subscribe(self._route, (OWNER_UP,))
        self._ends_routed = False

    def owner_extension(self, owner: OwnerHandle) -> DepsOwner:
        """Serve dependencies on ``owner`` (child and parent sides)."""

        async def call(queue: str, op: str, **fields: Any) -> dict[str, Any]:
            return await self.client(queue).call(op, **fields)

        ext = DepsOwner(owner, call, self._watching)
        self._owners[owner.name] = ext  # a restarted owner's extension replaces the old one
        return ext

    def _watching(self) -> None:
        """A parent on one of this node's owners gained a watch: from now on, route job ends
        (and purges) too."""
        if not self._ends_routed:
            self._ends_routed = True
            self._events.subscribe(self._route, ROUTED - {OWNER_UP})

    def _route(self, event: JobEvent) -> None:
        ext = self._owners.get(event.queue)
        if ext is not None and ext.owner.running and (ext.watches or event.kind == OWNER_UP):
            ext.on_event(event)  # (an end nobody watches stops here)
