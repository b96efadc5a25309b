"""Extension points of :class:`istos.Istos`, shared by its feature mixins.

Each feature (workflows, schedules, pub/sub) lives in its own module as a mixin that overrides
these hooks and calls ``super()``, so ``app.py`` stays about queues and lifecycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .queue.owner import QueueOwner


class AppHooks:
    def _setup_owner(self, owner: QueueOwner) -> None:
        """Called for each owner this node starts, before it binds its queue."""

    async def _continue_hook(self, meta: dict[str, Any], result: Any) -> None:
        """Called by a worker after its function returned and before it acks (workflows)."""
