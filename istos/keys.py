"""Every key expression of a queue: the ONE module that spells them, for owners and callers.

A queue's keys live under ``{prefix}/q/{queue}/``: ``rpc/{role}`` (requests, one key per role
so Zenoh access control can grant them apart: :data:`istos.protocol.ROLES`), ``events`` (the
owner's published event batches), ``nudge`` and ``cancel`` (messages to workers) and
``workers/{node}`` (the liveliness tokens of workers that park claims). The owner serves and
publishes on these, every client sends to them; neither writes the format itself
(``tests/test_keys.py`` checks that no other module does).
"""

from __future__ import annotations

from .protocol import role_of

RPC = "rpc"
EVENTS = "events"
WORKER_TOKENS = "workers"


def queue_key(prefix: str, queue: str, leaf: str) -> str:
    """The key expression of ``queue``'s ``leaf`` (rpc, nudge, events, cancel) under ``prefix``."""
    return f"{prefix}/q/{queue}/{leaf}"


def rpc_base(prefix: str, queue: str) -> str:
    """The key under which ``queue``'s owner serves requests (one role key below it each)."""
    return queue_key(prefix, queue, RPC)


def op_key(base: str, op: str) -> str:
    """The key a request for ``op`` goes to, below a queue's :func:`rpc_base` ``base``."""
    return f"{base}/{role_of(op)}"


def rpc_key(prefix: str, queue: str, op: str) -> str:
    """The key a request for ``op`` to ``queue``'s owner goes to: ``.../rpc/{role}``."""
    return op_key(rpc_base(prefix, queue), op)


def events_key(prefix: str, queue: str) -> str:
    """The key ``queue``'s owner publishes its event batches on (while someone follows)."""
    return queue_key(prefix, queue, EVENTS)


def worker_token_key(prefix: str, queue: str, node_id: str | None = None) -> str:
    """The liveliness token a node whose workers park claims on ``queue`` declares while it
    serves; without ``node_id``, the owner's watch of them all."""
    return queue_key(prefix, queue, f"{WORKER_TOKENS}/{'**' if node_id is None else node_id}")
