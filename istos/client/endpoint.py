"""Where calls come from: a caller with no node of its own, and one client per queue.

An app's node is an :class:`~istos.client.call.Endpoint` already. The SyncProducer, the CLI's
operator and ``istos_nb``'s ``LiveQueue`` hold a Zenoh session but serve nothing: they call
from a :class:`Remote` (its transport, prefix, request timeout and the system clock), and keep
one :class:`~istos.client.call.OwnerClient` per queue in :class:`Clients`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..clock import Clock, SystemClock
from ..core.config import check_queue_name
from ..ids import IdSource
from ..node import LocalOwner, no_local_owner
from .call import Endpoint, OwnerClient, Querier


@dataclass
class Remote:
    """A caller that serves no queue: every request goes over ``transport`` (None until its
    session is open; a call before raises :class:`~istos.errors.IstosError`)."""

    transport: Querier | None
    prefix: str = "istos"
    request_timeout_s: float = 5.0
    clock: Clock = field(default_factory=SystemClock)
    local_owner: Callable[[str], LocalOwner | None] = no_local_owner
    ids: IdSource = field(default_factory=IdSource)  # job ids, when it enqueues


class Clients:
    """One :class:`OwnerClient` per queue name (checked once: ``ConfigError`` for a bad one),
    kept so a queue's coalesced enqueues share one client."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self._by_queue: dict[str, OwnerClient] = {}

    def __call__(self, queue: str) -> OwnerClient:
        client = self._by_queue.get(queue)
        if client is None:
            client = self._by_queue[queue] = OwnerClient(self.endpoint, check_queue_name(queue))
        return client
