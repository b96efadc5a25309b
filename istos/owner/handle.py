"""What op handlers and extensions may use of an owner: an interface, not the owner's class.

``handlers/job_ops.py`` and ``handlers/bulk.py`` are built by the owner (``owner.py`` imports them),
so they take this protocol rather than :class:`~istos.owner.owner.QueueOwner`: no import circle, and
the write path (:class:`~istos.owner.persistence.write_path.WritePath`) is the only way they make a
change count.

An extension changes nothing of the owner's but through the named registrations below (a meta
check, a nudge absorber, the leader's deadline and wake); it never assigns an owner's
attribute or fills one of its collections (``tests/test_owner_handle_rule.py`` checks).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ..core.config import QueueConfig
from ..core.hungry import HungryNodes
from ..core.state import QueueState
from ..node import Node
from ..storage.base import Fence, Storage
from .extension import Handler, OwnerExtension
from .handlers.nudges import Absorber
from .persistence.pause_store import PauseStore
from .persistence.write_path import WritePath

MetaCheck = Callable[[str, "dict[str, Any] | None"], Awaitable[None]]
"""Checks an enqueue's job meta (or reserved id) before anything is stored; raises to refuse."""


class OwnerHandle(Protocol):
    name: str
    node: Node
    config: QueueConfig
    state: QueueState
    durable: bool
    writes: WritePath
    hungry: HungryNodes
    running: bool  # serving now (a timer set before a stop must not nudge after it)
    fence: Fence | None  # an HA leader's (leader lease and epoch); None otherwise
    storage: Storage  # the node's storage, fenced for an HA leader
    pauses: PauseStore  # the queue's stored pauses (pause, resume: stored, then applied)

    def require_admin(self, action: str) -> None:
        """Raise :class:`~istos.errors.AdminDisabled` unless the queue was declared admin."""

    async def enqueue(self, body: bytes, *, job_id: str, delay_s: float = 0.0,
                      priority: int = 0, meta: dict[str, Any] | None = None,
                      dedup_s: float | None = None, group: str | None = None,
                      start_by: float | None = None) -> bool:
        """Accept a job on this owner's node (False: it held ``job_id`` already)."""
        ...

    def stats(self) -> dict[str, Any]:
        """The queue's counts and age of its oldest ready job."""
        ...

    def nudge(self, count: int) -> None:
        """Tell idle workers that ``count`` jobs became claimable."""

    def before_ack_hooks(self, with_meta: bool) -> list[OwnerExtension]:
        """The extensions to run before an ack of a job with (or without) meta."""

    def handler(self, op: str) -> Handler | None:
        """The handler serving ``op`` now (None: the owner does not serve it)."""

    def extend(self, ext: OwnerExtension, *, first: bool = False) -> None:
        """Install one extension (the app does it once, through ``pipeline.compose``)."""

    # -- named registrations: the only changes an extension makes to its owner --
    def check_meta_with(self, check: MetaCheck) -> None:
        """Accept enqueues with job meta or a reserved id only once ``check`` passed them."""

    def absorb_nudges(self, absorber: Absorber) -> None:
        """Hand the nodes chosen for each nudge to ``absorber`` too (parked claims)."""

    def lead_until(self, deadline: float) -> None:
        """An HA leader serves until ``deadline`` unless renewed before."""

    def wake_election_with(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` when this leader finds its lease lapsed or its epoch gone."""
