"""Bulk enqueue: many jobs in one request (``enqueue_many``), both sides of the wire.

Producer side: :func:`frames` cuts a batch into requests that each stay under the frame cap (by
bytes, under :data:`~istos.protocol.PAGE_BUDGET`, and by count, at most
:data:`~istos.protocol.MAX_ENQUEUE_ITEMS`), and :func:`send_many` sends them one round trip
each. Owner side: :func:`enqueue_many` accepts one request's jobs with one write-through for the
whole request -- write, then apply: every new record is stored in the same storage ``apply``
(one Redis MULTI/EXEC or Lua script, one SQL transaction) before any of them enters the queue,
so a storage failure leaves none of them stored or queued and the request fails as a whole with
:class:`~istos.errors.StorageUnavailable`.

Idempotent per item: the producer chooses every job id, so a retried request (after a timeout
whose first try was in fact stored) adds nothing twice; ids the queue already holds, or that
repeat within the request, answer ``created: false``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .. import protocol
from ..core.state import JobRecord
from ..errors import IstosError, StorageUnavailable

if TYPE_CHECKING:
    from ..worker.client import OwnerClient
    from .owner import QueueOwner

ITEM_OVERHEAD = 64  # msgpack bytes of one item's map besides its body and job id (at most)


def item_size(item: dict[str, Any]) -> int:
    """An upper bound of one item's encoded bytes in an ``enqueue_many`` request."""
    return len(item["body"]) + 4 * len(item["job_id"]) + ITEM_OVERHEAD


def cut(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """``(start, end)`` of each request of a batch of items of these sizes, in order: each
    under the byte budget and the count cap (an item alone always fits: a body is at most
    MAX_BODY_BYTES)."""
    out: list[tuple[int, int]] = []
    start, used = 0, 0
    for i, size in enumerate(sizes):
        if i > start and (used + size > protocol.PAGE_BUDGET
                          or i - start >= protocol.MAX_ENQUEUE_ITEMS):
            out.append((start, i))
            start, used = i, 0
        used += size
    if start < len(sizes):
        out.append((start, len(sizes)))
    return out


def frames(job_ids: Sequence[str], bodies: Sequence[bytes], delay_s: float, priority: int
           ) -> list[list[dict[str, Any]]]:
    """The ``items`` of each request of a batch, in order (see :func:`cut`)."""
    items: list[dict[str, Any]] = []
    for jid, body in zip(job_ids, bodies):
        item: dict[str, Any] = {"body": body, "job_id": jid}
        if delay_s:
            item["delay_s"] = delay_s
        if priority:
            item["priority"] = priority
        items.append(item)
    return [items[a:b] for a, b in cut([item_size(i) for i in items])]


async def send_many(client: OwnerClient, job_ids: list[str], bodies: list[bytes],
                    delay_s: float, priority: int, timeout_s: float | None) -> list[str]:
    """Send a checked batch, one request per frame, in order; returns ``job_ids``.

    A failure after the first frame leaves the frames before it stored: the error says how
    many jobs, and sending the batch again with the same ids adds only the rest.
    """
    stored = 0
    for items in frames(job_ids, bodies, delay_s, priority):
        try:
            await client.call("enqueue_many", timeout_s, items=items)
        except IstosError as exc:
            if not stored:
                raise
            raise type(exc)(f"{exc} (the first {stored} of {len(job_ids)} jobs were stored by "
                            "earlier requests; enqueue the batch again with the same job_ids "
                            "to add the rest)") from exc
        stored += len(items)
    return job_ids


async def op_enqueue_many(owner: QueueOwner, msg: dict[str, Any]) -> dict[str, Any]:
    """The owner's ``enqueue_many`` op (``items`` checked against protocol.SCHEMAS)."""
    return {"created": await enqueue_many(owner, msg["items"])}


async def enqueue_many(owner: QueueOwner, items: list[dict[str, Any]]) -> list[bool]:
    """Accept the jobs of one request; per item, whether it was new (see the module doc)."""
    state, clock = owner.state, owner.node.clock
    if not owner.durable:
        now = clock.now()
        created = [state.enqueue(i["job_id"], i["body"], now,
                                 delay_s=float(i.get("delay_s", 0.0)),
                                 priority=i.get("priority", 0)) for i in items]
        state.dirty.clear()
        owner._after_change()
        return created
    pending = owner._pending_ids
    while True:  # ids another request is writing right now: their outcome decides ours
        waits = {pending[i["job_id"]] for i in items if i["job_id"] in pending}
        if not waits:
            break
        await asyncio.gather(*waits, return_exceptions=True)
    now = clock.now()
    new: dict[str, JobRecord] = {}
    created = []
    for item in items:
        jid = item["job_id"]
        if jid in new or state.holds(jid):
            if jid not in new:
                state.enqueue(jid, item["body"], now)  # the duplicate_enqueue event only
            created.append(False)
            continue
        new[jid] = state.new_record(jid, item["body"], now,
                                    delay_s=float(item.get("delay_s", 0.0)),
                                    priority=item.get("priority", 0))
        created.append(True)
    if new:
        await _write_then_insert(owner, new)
    owner._after_change()
    return created


async def _write_then_insert(owner: QueueOwner, new: dict[str, JobRecord]) -> None:
    loop = asyncio.get_running_loop()
    futs: dict[str, asyncio.Future[str]] = {jid: loop.create_future() for jid in new}
    owner._pending_ids.update(futs)
    try:
        await owner._persister.write(list(new.values()))
    except StorageUnavailable as exc:
        for fut in futs.values():
            fut.set_exception(exc)
            fut.exception()  # retrieved: waiters re-check the queue themselves
        raise
    finally:
        for jid in futs:
            owner._pending_ids.pop(jid, None)
    now = owner.node.clock.now()
    for rec in new.values():
        owner.state.insert(rec, now)
    for jid, fut in futs.items():
        fut.set_result(jid)
