"""The one way to extend a queue owner (in the spirit of dramatiq's middleware).

An extension serves extra ops and hooks into three moments of the owner's life: before an ack is
applied (workflow barriers), when the owner stops, and when it nudges idle workers. Subclass
:class:`OwnerExtension` and override what you need, or wrap plain callables in :class:`Hooks`;
hand it to :meth:`QueueOwner.extend`. Only the hooks an extension overrides are called, so an
extension costs the hot path nothing it does not use.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..core.records import JobRecord

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
"""An op's handler: the checked request in, the reply's fields out (``ok``/``v`` added)."""
AckHook = Callable[[JobRecord, "bytes | None"], Awaitable[None]]
NudgeListener = Callable[[int, "set[str]"], None]


class OwnerExtension:
    """Base of owner extensions; every method is a no-op until overridden."""

    before_ack_meta_only = False
    """True: :meth:`before_ack` is only for jobs that carry ``meta`` (workflow steps), so the
    owner skips it, and its token check, for every other ack (the hot path)."""

    def ops(self) -> Mapping[str, Handler]:
        """Ops this extension serves, by name. Read once, when added; an op named here
        replaces one of the same name served before (the owner's own, or an earlier
        extension's), so an extension can wrap it (:meth:`QueueOwner.handler`)."""
        return {}

    async def before_ack(self, rec: JobRecord, result: bytes | None) -> None:
        """Runs before the ack of ``rec``'s current delivery is applied; raising an
        :class:`~istos.errors.IstosError` refuses the ack (the job stays leased)."""

    def on_stop(self) -> None:
        """The owner stopped cleanly (not called on a kill)."""

    def on_nudge(self, count: int, targets: set[str]) -> None:
        """The owner is about to nudge ``targets`` (node ids) for ``count`` claimable jobs."""


class Hooks(OwnerExtension):
    """An extension made of plain callables (any left out does nothing)."""

    def __init__(self, *, ops: Mapping[str, Handler] | None = None,
                 before_ack: AckHook | None = None, on_stop: Callable[[], None] | None = None,
                 on_nudge: NudgeListener | None = None,
                 before_ack_meta_only: bool = False) -> None:
        self._ops = dict(ops or {})
        self.before_ack_meta_only = before_ack_meta_only
        self._before_ack, self._on_stop, self._on_nudge = before_ack, on_stop, on_nudge

    def ops(self) -> Mapping[str, Handler]:
        return self._ops

    async def before_ack(self, rec: JobRecord, result: bytes | None) -> None:
        if self._before_ack is not None:
            await self._before_ack(rec, result)

    def on_stop(self) -> None:
        if self._on_stop is not None:
            self._on_stop()

    def on_nudge(self, count: int, targets: set[str]) -> None:
        if self._on_nudge is not None:
            self._on_nudge(count, targets)


def overrides(ext: OwnerExtension, hook: str) -> bool:
    """Whether ``ext`` does something at ``hook`` (a name of an :class:`OwnerExtension` method)."""
    if isinstance(ext, Hooks):
        return getattr(ext, f"_{hook}") is not None
    return getattr(type(ext), hook) is not getattr(OwnerExtension, hook)
