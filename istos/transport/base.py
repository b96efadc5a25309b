"""The Transport port: what the engine asks of the mesh.

One role in two port packages: each port package keeps its port in ``base.py`` (this one, and
``storage/base.py``), its adapters beside it.

Two adapters implement it: :mod:`istos.transport.zenoh` (live) and :mod:`istos.transport.local`
(the in-process mesh the simulator runs on). Every callback the engine registers is invoked on
the asyncio loop that called ``start()``, never on a foreign thread.

Key expressions follow Zenoh: ``/``-separated chunks, ``*`` matches one chunk, ``**`` any number.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from ..errors import IstosError

QueryHandler = Callable[[str, bytes], Awaitable[bytes]]
"""``(key, request_payload) -> reply_payload``; runs as a task on the loop."""

SampleHandler = Callable[[str, bytes], None]
"""``(key, payload)``; called on the loop, must not block."""

LivelinessHandler = Callable[[str, bool], None]
"""``(token_key, alive)``; called on the loop when a token appears (True) or drops (False)."""


class TransportError(IstosError):
    """Base of transport failures."""


class TransportTimeout(TransportError):
    """No reply arrived within the timeout."""


class NoResponder(TransportError):
    """No queryable matched the key (nobody serves it)."""


class Handle(Protocol):
    def close(self) -> None:
        """Undeclare (idempotent)."""


@runtime_checkable
class Transport(Protocol):
    node_id: str

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def kill(self) -> None:
        """Die at once, as a crashed process's transport does, as far as this adapter can.

        The in-process mesh drops every registration and cancels in-flight handlers (its
        peers see the node vanish). A live Zenoh session dies with its process only: within
        the process it is left as it is (the app's crash stops everything above it).
        """

    async def declare_queryable(self, key: str, handler: QueryHandler) -> Handle:
        """Serve requests on ``key``; each request runs ``handler`` and its result is the reply."""

    async def query(self, key: str, payload: bytes, timeout_s: float) -> bytes:
        """Send a request and return the first reply.

        Raises :class:`NoResponder` when no queryable serves ``key`` and :class:`TransportTimeout`
        when none answers within ``timeout_s``.
        """

    async def put(self, key: str, payload: bytes) -> None:
        """Publish ``payload`` to every subscriber matching ``key`` (fire and forget)."""

    async def declare_subscriber(self, key_expr: str, handler: SampleHandler) -> Handle: ...

    async def declare_liveliness_token(self, key: str) -> Handle:
        """Announce this node's presence at ``key`` until the handle is closed or the node dies."""

    async def watch_liveliness(self, key_expr: str, handler: LivelinessHandler) -> Handle:
        """Report tokens matching ``key_expr``: current ones first (alive=True), then changes."""

    async def liveliness_alive(self, key_expr: str, timeout_s: float = 1.0) -> list[str]:
        """Keys of the tokens currently alive that match ``key_expr``, sorted."""


def key_matches(expr: str, key: str) -> bool:
    """Zenoh-style match of a concrete ``key`` against ``expr`` with ``*`` and ``**``."""
    return _match(expr.split("/"), key.split("/"))


def _match(pat: list[str], parts: list[str]) -> bool:
    if not pat:
        return not parts
    head = pat[0]
    if head == "**":
        return any(_match(pat[1:], parts[i:]) for i in range(len(parts) + 1))
    if not parts:
        return False
    if head == "*" or head == parts[0]:
        return _match(pat[1:], parts[1:])
    return False
