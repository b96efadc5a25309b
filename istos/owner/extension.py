"""The one way to extend a queue owner (in the spirit of dramatiq's middleware).

An extension *declares* what it does to the owner's ops: ``serves`` names the ops it adds
(:meth:`OwnerExtension.ops` gives their handlers) and ``wraps`` the ops it wraps (the owner
hands it the handler serving each one so far, :meth:`OwnerExtension.wrap`, and serves the
wrapper from then on). The order in which extensions wrap is data, not code: the owner pipeline
(``owner/composition.py``) names every extension an app installs, in order, and builds the chain
once. An extension also hooks into three moments of the owner's life: before an ack is applied
(workflow barriers), when the owner stops, and when it nudges idle workers. Subclass
:class:`OwnerExtension` and override what you need, or wrap plain callables in :class:`Hooks`.
Only the hooks an extension overrides are called, so an extension costs the hot path nothing it
does not use. An extension reaches the owner only through the typed handle
(``owner/handle.py``), whose named registrations stand for any change it makes to the owner.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..core.records import JobRecord
from ..errors import ConfigError

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
"""An op's handler: the checked request in, the reply's fields out (``ok``/``v`` added)."""
AckHook = Callable[[JobRecord, "bytes | None"], Awaitable[None]]
NudgeListener = Callable[[int, "set[str]"], None]


class OwnerExtension:
    """Base of owner extensions; every method is a no-op until overridden."""

    name: str = ""
    """The extension's name in the owner pipeline (``owner/composition.py``)."""
    serves: tuple[str, ...] = ()
    """The ops this extension adds (the keys of :meth:`ops`)."""
    wraps: tuple[str, ...] = ()
    """The ops this extension wraps (:meth:`wrap`), each served before it is installed."""
    meta_only_wraps: tuple[str, ...] = ()
    """Those of :attr:`wraps` whose wrapper acts only on requests that carry ``meta`` and
    hands every other request to the inner handler unchanged: the owner serves a request
    without ``meta`` by the handler beneath the wrapper, so a plain enqueue pays nothing for
    an extension that only reads job meta (batches, dependencies)."""

    before_ack_meta_only = False
    """True: :meth:`before_ack` is only for jobs that carry ``meta`` (workflow steps), so the
    owner skips it, and its token check, for every other ack (the hot path)."""

    def ops(self) -> Mapping[str, Handler]:
        """Handlers of the ops in :attr:`serves`, by name. Read once, when installed."""
        return {}

    def wrap(self, op: str, inner: Handler) -> Handler:
        """The handler to serve ``op`` (one of :attr:`wraps`) from now on; ``inner`` is the
        handler serving it so far, which the wrapper calls. Called once per wrapped op, when
        the extension is installed."""
        raise NotImplementedError(f"{type(self).__name__} declares it wraps {op!r} but does "
                                  "not implement wrap()")

    async def before_ack(self, rec: JobRecord, result: bytes | None) -> None:
        """Runs before the ack of ``rec``'s current delivery is applied; raising an
        :class:`~istos.errors.IstosError` refuses the ack (the job stays leased)."""

    def on_stop(self) -> None:
        """The owner stopped cleanly (not called on a kill)."""

    def on_nudge(self, count: int, targets: set[str]) -> None:
        """The owner is about to nudge ``targets`` (node ids) for ``count`` claimable jobs."""


class Hooks(OwnerExtension):
    """An extension made of plain callables (any left out does nothing)."""

    def __init__(self, *, name: str = "", ops: Mapping[str, Handler] | None = None,
                 before_ack: AckHook | None = None, on_stop: Callable[[], None] | None = None,
                 on_nudge: NudgeListener | None = None,
                 before_ack_meta_only: bool = False) -> None:
        self.name = name
        self._ops = dict(ops or {})
        self.serves = tuple(self._ops)
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


async def not_wrapped(msg: dict[str, Any]) -> dict[str, Any]:
    """Stands for the inner handler of a wrapped op until the owner installs the wrapper.

    Raises:
        ConfigError: always (the extension was used without being installed on an owner).
    """
    raise ConfigError(f"op {msg.get('op')!r}: its wrapper was never installed on an owner")


def overrides(ext: OwnerExtension, hook: str) -> bool:
    """Whether ``ext`` does something at ``hook`` (a name of an :class:`OwnerExtension` method)."""
    if isinstance(ext, Hooks):
        return getattr(ext, f"_{hook}") is not None
    return getattr(type(ext), hook) is not getattr(OwnerExtension, hook)
