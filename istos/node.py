"""What one node hands its owners and workers: the three ports plus identity and chance."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from . import keys
from .clock import Clock
from .events import EventLog
from .ids import IdSource
from .payload import CodecChain
from .storage.base import Storage
from .transport.base import Transport

if TYPE_CHECKING:  # (a type only: istos.tracing imports opentelemetry on use)
    from .tracing import Tracing

RunSync = Callable[[Callable[[], Any]], Awaitable[Any]]
"""The executor port: how the engine runs a plain (sync) worker or subscriber function.

Awaited with the call (its arguments bound); returns its result or raises its exception.
"""


async def run_inline(call: Callable[[], Any]) -> Any:
    """Run ``call`` on the loop, right away (the simulator's executor: virtual time does not
    pass while a plain function runs, so running it on a thread would only add nondeterminism)."""
    return call()


class LocalOwner(Protocol):
    """An owner serving in this process, as the request path and the process's registry of
    running owners (``owner/leadership/registry.py``) see it: calls to its queue go straight to
    ``dispatch`` instead of over the mesh (the worker and the client never import the owner)."""

    name: str
    node: Node
    running: bool
    durable: bool

    def dispatch(self, msg: dict[str, Any], *, trusted: bool = False,
                 role: str | None = None) -> Coroutine[Any, Any, dict[str, Any]]: ...


def no_local_owner(queue: str) -> LocalOwner | None:
    return None


@dataclass
class Node:
    node_id: str
    clock: Clock
    rng: random.Random
    ids: IdSource
    storage: Storage
    transport: Transport | None = None
    prefix: str = "istos"
    request_timeout_s: float = 5.0
    # How plain (sync) functions run; None: on threads (each worker's own pool, sized to its
    # concurrency; subscribers on the loop's default executor).
    run_sync: RunSync | None = None
    events: EventLog = field(default_factory=EventLog)
    # Payload codecs this node's producers and workers apply to bodies and results.
    payload: CodecChain = field(default_factory=CodecChain)
    # OpenTelemetry spans of this node's producers and workers (istos.tracing); None: off.
    tracing: Tracing | None = None
    # The owner of ``queue`` serving in this process, if any (the app installs its lookup).
    local_owner: Callable[[str], LocalOwner | None] = no_local_owner

    def key(self, queue: str, leaf: str) -> str:
        """The key expression of a queue's ``leaf`` (nudge, events, cancel) under this prefix."""
        return keys.queue_key(self.prefix, queue, leaf)

    def worker_token_key(self, queue: str, node_id: str | None = None) -> str:
        """The liveliness token a node whose workers park claims on ``queue`` declares while
        it serves (``owner/extensions/parking.py``); without ``node_id``, the owner's watch of them
        all."""
        return keys.worker_token_key(self.prefix, queue, node_id)
