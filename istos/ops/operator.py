"""An operator's read-mostly session on the mesh: what ``istos`` (the CLI) and ``istos metrics``
use to talk to queue owners, with no notebook dependency.

One :class:`Operator` holds one Zenoh session (client or peer mode, as its config says) and an
:class:`~istos.client.OwnerClient` per queue: the engine's one request path, so retries,
timeouts and typed errors are the ones producers and workers see. It declares no worker and no
queryable and never claims; the follower (:mod:`.follow`) asks owners to publish their events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from .. import codec
from ..client import Clients, OwnerClient
from ..client.follow import MARKERS, Follower
from ..client.pages import dead_pages, jobs_pages, series_pages, workers_pages
from ..clock import SystemClock
from ..core.state import STATES
from ..errors import ConfigError, OwnerUnavailable
from ..ids import IdSource, node_rng
from ..node import Node
from ..payload import describe
from ..storage.memory import MemoryStorage
from ..transport.zenoh import ZenohTransport


class Operator:
    """Requests to queue owners over a Zenoh session of its own; use ``async with``.

    Every call raises :class:`~istos.errors.OwnerUnavailable` when no owner answers within
    ``timeout_s``, and the typed error the owner answered with otherwise.
    """

    def __init__(self, zenoh: Any = None, *, prefix: str = "istos",
                 timeout_s: float = 5.0) -> None:
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
                or not timeout_s > 0:
            raise ConfigError(f"timeout must be a number > 0, got {timeout_s!r}")
        rng = node_rng()
        self.node = Node(node_id=f"istos-cli-{IdSource(rng).new()[:8]}", clock=SystemClock(),
                         rng=rng, ids=IdSource(rng), storage=MemoryStorage(), prefix=prefix,
                         request_timeout_s=float(timeout_s))
        self._transport = ZenohTransport(zenoh, node_id=self.node.node_id)
        self._clients = Clients(self.node)
        self._opened = 0.0  # when the session opened (monotonic): discovery's settle window

    async def __aenter__(self) -> Operator:
        """Open the session. The config was parsed already (a bad one raised ConfigError), so
        a failure here means the mesh is unreachable: :class:`OwnerUnavailable`."""
        try:
            await self._transport.start()
        except ConfigError as exc:
            reason = str(exc).split(" at /", 1)[0]  # zenoh appends its Rust source location
            raise OwnerUnavailable(f"cannot reach the Zenoh mesh: {reason}") from exc
        self.node.transport = self._transport
        self._opened = self.node.clock.monotonic()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.node.transport = None
        await self._transport.close()

    @property
    def transport(self) -> ZenohTransport:
        """The session's transport (subscriptions of its own, e.g. a follower's)."""
        return self._transport

    def now(self) -> float:
        """This machine's wall clock (epoch seconds), for ages."""
        return self.node.clock.now()

    async def call(self, queue: str, op: str, *, timeout_s: float | None = None,
                   **fields: Any) -> dict[str, Any]:
        """One request to ``queue``'s owner within ``timeout_s`` (default: the session's);
        its checked reply."""
        return await self._clients(queue).call(op, timeout_s, **fields)

    async def discover(self) -> dict[str, dict[str, Any]]:
        """Every queue under this prefix whose owner or HA replica is on the mesh
        (:mod:`istos.ops.discovery`): ``{queue: {"owners": [...], "replicas": [...]}}``."""
        from .discovery import SETTLE_S, discover

        young = SETTLE_S - (self.node.clock.monotonic() - self._opened)
        return await discover(self._transport, self.node.prefix, self.node.request_timeout_s,
                              settle_s=max(0.0, young), clock=self.node.clock)

    async def queue_names(self, given: list[str] | None = None) -> list[str]:
        """``given`` if any, else every queue discovered (none found: OwnerUnavailable)."""
        if given:
            return list(given)
        names = list(await self.discover())
        if not names:
            raise OwnerUnavailable(f"no queue found under prefix {self.node.prefix!r}")
        return names

    async def stats(self, queue: str) -> dict[str, Any]:
        return dict((await self.call(queue, "stats"))["stats"])

    async def jobs(self, queue: str, state: str | None = None,
                   where: dict[str, Any] | None = None, limit: int | None = 100,
                   offset: int = 0, filters: dict[str, Any] | None = None,
                   notes: dict[str, int] | None = None
                   ) -> tuple[list[dict[str, Any]], int | None, bool]:
        """``(rows, total, truncated)``: at most ``limit`` jobs (None: all) from ``offset``.
        ``notes`` (if given) gets ``unsearched``: bodies encoded by payload codecs that a
        ``where`` search could not look into (they never match).

        ``total`` is how many match in all (from the owner's counts without ``where`` or
        ``filters``; None when a search stopped early); ``truncated`` whether rows were left
        out. ``filters``: the ``jobs`` op's search fields (error, worker, time ranges).
        """
        if state is not None and state not in STATES:
            raise ConfigError(f"state must be one of {', '.join(STATES)}, got {state!r}")
        want = None if limit is None else limit + 1  # one more row says whether more exist
        rows, more, _ = await jobs_pages(self._clients(queue), state, dict(where or {}), want,
                                         offset, filters, notes)
        truncated = (limit is not None and len(rows) > limit) or more
        rows = rows if limit is None else rows[:limit]
        total: int | None = None
        if not truncated and (rows or not offset):
            total = offset + len(rows)
        elif not where and not filters:
            counts = (await self.stats(queue))["counts"]
            total = counts.get(state, 0) if state else sum(counts.values())
        return rows, total, truncated

    async def workers(self, queue: str) -> list[dict[str, Any]]:
        """The owner's table of workers seen lately (every page)."""
        return await workers_pages(self._clients(queue))

    async def dead(self, queue: str, limit: int | None = None) -> list[dict[str, Any]]:
        """Dead letters, oldest first; every page unless ``limit`` caps them."""
        return await dead_pages(self._clients(queue), limit)

    async def follow(self, queue: str) -> AsyncIterator[dict[str, Any]]:
        """The owner's live events, one dict each (as the owner emitted them), until the caller
        stops iterating; :class:`~istos.client.follow.Follower` gives its markers too."""
        async for item in self.follower(queue).items():
            if item.get("kind") not in MARKERS:
                yield {k: v for k, v in item.items() if k != "seq"}

    def client(self, queue: str) -> OwnerClient:
        """The request client of ``queue``'s owner on this session (ConfigError: a bad name)."""
        return self._clients(queue)

    def follower(self, queue: str) -> Follower:
        """A :class:`~istos.client.follow.Follower` of ``queue`` on this session (markers
        included)."""
        return Follower(self._transport, self._clients(queue))

    async def series(self, queue: str, since: float | None, resolution: str = "1s"
                     ) -> list[dict[str, Any]]:
        """Every page of the owner's series rows from ``since`` (None: all it keeps)."""
        return await series_pages(self._clients(queue), since, resolution)


def decode_body(raw: Any) -> Any:
    """A job body for display: decoded msgpack; for a body encoded by payload codecs, what
    it is encoded with and its size (the CLI holds no codecs); else the raw value."""
    if not isinstance(raw, bytes):
        return raw
    encoded = describe(raw)
    if encoded is not None:
        return f"<{encoded}>"
    try:
        return codec.decode_body(raw)
    except Exception:  # msgpack raises several unrelated types
        return raw


