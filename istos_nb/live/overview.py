"""Every queue under a prefix as a DataFrame: ``istos_nb.queues(zenoh=..., prefix=...)`` (and
``await istos_nb.aqueues(...)``), the notebook twin of ``istos queues``.

One Operator session (the CLI's, :mod:`istos.ops.operator`) on a private loop thread, opened
and closed per call: discovery is one liveliness query plus one ``stats`` per queue.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from istos.ops.discovery import queue_rows
from istos.ops.operator import Operator

from .loop import LoopThread, async_call, sync_call

__all__ = ["queues", "aqueues", "QUEUE_COLUMNS"]

QUEUE_COLUMNS = {"queue": object, "owner": object, "role": object, "replicas": object,
                 "up": "bool", "ready": "Int64", "delayed": "Int64", "leased": "Int64",
                 "done": "Int64", "dead": "Int64", "cancelled": "Int64", "expired": "Int64",
                 "enqueue_rate": "float64", "ack_rate": "float64", "paused": "boolean",
                 "pause_reason": object, "workers": "Int64"}


def queues(zenoh: Any = None, *, prefix: str = "istos", timeout_s: float = 5.0) -> pd.DataFrame:
    """One row per queue whose owner (or HA replica) is on the mesh under ``prefix``: queue,
    owner (the node that answered), role (single / ha), replicas, up (the owner answered; else
    the counts are NA), jobs per state, enqueue_rate and ack_rate (per second), paused,
    pause_reason (who paused it and why, as stored), workers (seen lately).

    Opens a Zenoh session of its own for the call (``zenoh`` as for ``Istos``) and closes it.
    An owner that does not answer within ``timeout_s`` gives a row with ``up`` False rather
    than an error; no queue found gives an empty frame. Raises :class:`ConfigError` for a
    bad ``timeout_s`` or Zenoh config, and :class:`OwnerUnavailable` if the whole survey
    takes longer than ``4 * timeout_s + 10`` seconds.
    """
    loop = LoopThread("istos-queues")
    try:
        return sync_call(loop, lambda: _rows(zenoh, prefix, timeout_s), 4 * timeout_s + 10,
                         "queues", prefix)
    finally:
        loop.stop(5.0)


async def aqueues(zenoh: Any = None, *, prefix: str = "istos",
                  timeout_s: float = 5.0) -> pd.DataFrame:
    """As :func:`queues`, awaitable: the caller's loop runs while the mesh is asked."""
    loop = LoopThread("istos-queues")
    try:
        return await async_call(loop, lambda: _rows(zenoh, prefix, timeout_s),
                                4 * timeout_s + 10, "queues", prefix)
    finally:
        loop.stop(5.0)


async def _rows(zenoh: Any, prefix: str, timeout_s: float) -> pd.DataFrame:
    async with Operator(zenoh, prefix=prefix, timeout_s=timeout_s) as op:
        rows = await queue_rows(op)
    return queues_frame(rows)


def queues_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    flat = [{**r, **(r.get("counts") or {})} for r in rows]
    return pd.DataFrame({name: pd.Series([r.get(name) for r in flat], dtype=dtype)
                         for name, dtype in QUEUE_COLUMNS.items()}, columns=list(QUEUE_COLUMNS))
