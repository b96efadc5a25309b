"""What the owner's built-in op handlers may use of it: an interface, not the owner's class.

``job_ops.py`` and ``bulk.py`` are built by the owner (``owner.py`` imports them), so they take
this protocol rather than :class:`~istos.owner.owner.QueueOwner`: no import circle, and the
write path (:class:`~istos.owner.write_path.WritePath`) is the only way they make a change count.
"""

from __future__ import annotations

from typing import Protocol

from ..core.config import QueueConfig
from ..core.hungry import HungryNodes
from ..core.state import QueueState
from ..node import Node
from .extension import OwnerExtension
from .write_path import WritePath


class OwnerHandle(Protocol):
    name: str
    node: Node
    config: QueueConfig
    state: QueueState
    durable: bool
    writes: WritePath
    hungry: HungryNodes
    running: bool  # serving now (a timer set before a stop must not nudge after it)

    def nudge(self, count: int) -> None:
        """Tell idle workers that ``count`` jobs became claimable."""

    def before_ack_hooks(self, with_meta: bool) -> list[OwnerExtension]:
        """The extensions to run before an ack of a job with (or without) meta."""
