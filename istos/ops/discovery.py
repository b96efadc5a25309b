"""Every queue under a prefix, found on the mesh: ``istos queues``, and ``istos stats``,
``istos workers`` and ``istos metrics`` without queue names (``istos_nb.queues`` too).

One concept at two sides: finding the queues here (the operator's), announcing them in
``owner/leadership/discovery.py`` (the owner's).

One liveliness query on ``{prefix}/dir/**`` finds the owners serving
(``owner/leadership/discovery.py``), one on ``{prefix}/ha/**`` the HA replicas; then each queue's
owner is asked for its ``stats`` (concurrently, each bounded by the request timeout). A queue whose
owner does not answer is still listed, with ``up`` False and no counts: the operator sees it exists
but is not told numbers nobody vouched for.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..clock import Clock, SystemClock
from ..errors import IstosError
from ..owner.leadership.discovery import DIR
from ..transport.base import Transport
from .pause_view import pause_phrase

SETTLE_S = 3.0
"""How long after its session opened an empty answer is asked again (bounded by the caller's
timeout): a session that has just opened may not have its links up, or the owners' tokens
routed to it, yet; a liveliness query then ends at once with nothing, which is not the owners'
truth. A session older than this is answered at once."""


async def _alive(transport: Transport, key_expr: str, timeout_s: float,
                 settle_s: float, clock: Clock) -> list[str]:
    """The live tokens under ``key_expr``, asked again while the answer is empty, for at most
    ``min(timeout_s, settle_s)`` seconds on ``clock`` (a young session on a mesh with no owner
    costs that wait)."""
    deadline = clock.monotonic() + min(timeout_s, settle_s)
    pause = 0.05
    while True:
        keys = await transport.liveliness_alive(key_expr, timeout_s)
        if keys or clock.monotonic() + pause > deadline:
            return keys
        await clock.sleep(pause)
        pause = min(pause * 2, 0.5)


async def discover(transport: Transport, prefix: str, timeout_s: float, *,
                   settle_s: float = 0.0,
                   clock: Clock | None = None) -> dict[str, dict[str, Any]]:
    """``{queue: {"owners": [node ids], "replicas": [node ids]}}``, sorted by queue name.

    An empty answer is asked again for up to ``min(timeout_s, settle_s)`` seconds (give the
    time left of :data:`SETTLE_S` since the session opened), so a session opened just before
    the call still sees the owners; those waits are on ``clock`` (the caller's node's,
    default the system clock). Raises :class:`TransportError` when the mesh refuses the
    query."""
    found: dict[str, dict[str, Any]] = {}
    for kind, leaf in (("owners", DIR), ("replicas", "ha")):
        base = f"{prefix}/{leaf}/"
        keys = await (_alive(transport, f"{base}**", timeout_s, settle_s,
                                    clock or SystemClock()) if kind == "owners" else
                      transport.liveliness_alive(f"{base}**", timeout_s))
        for key in keys:
            queue, _, last = key[len(base):].rpartition("/")
            if not queue:
                continue
            entry = found.setdefault(queue, {"owners": [], "replicas": []})
            # an HA candidate is "{start time}-{node id}"
            entry[kind].append(last.split("-", 1)[1] if kind == "replicas" and "-" in last
                               else last)
    return {q: found[q] for q in sorted(found)}


async def queue_rows(op: Any) -> list[dict[str, Any]]:
    """One row per discovered queue: queue, owner (the node that answered), role, replicas,
    up, counts, dead, rates, paused, pause_reason (``op``: an
    :class:`~istos.ops.operator.Operator`)."""
    found = await op.discover()

    async def one(queue: str, entry: dict[str, Any]) -> dict[str, Any]:
        row: dict[str, Any] = {"queue": queue, "owner": None,
                               "role": "ha" if entry["replicas"] else "single",
                               "replicas": sorted(entry["replicas"]), "up": False}
        try:
            stats = await op.stats(queue)
        except IstosError as exc:
            row["error"] = str(exc)
            return row
        counts = stats.get("counts") or {}
        row.update(owner=stats.get("node"), up=True, counts=counts,
                   dead=counts.get("dead", 0), enqueue_rate=stats.get("enqueue_rate"),
                   ack_rate=stats.get("ack_rate"), paused=stats.get("paused"),
                   pause_reason=pause_phrase(stats.get("pause")) or None,
                   workers=stats.get("workers_seen"))
        return row

    return list(await asyncio.gather(*(one(q, e) for q, e in found.items())))
