"""What one node hands its owners and workers: the three ports plus identity and chance."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from .clock import Clock
from .events import EventLog
from .ids import IdSource
from .storage.base import Storage
from .transport.base import Transport


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
    sync_inline: bool = False  # the simulator runs plain (sync) workers on the loop
    events: EventLog = field(default_factory=EventLog)

    def key(self, queue: str, leaf: str) -> str:
        """The key expression of a queue's ``leaf`` (rpc, nudge, events) under this prefix."""
        return f"{self.prefix}/q/{queue}/{leaf}"
