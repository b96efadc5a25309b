"""Bulk enqueue, the owner's side: one ``enqueue_many`` request's jobs in one write.

Write, then apply: every new record is stored in the same storage ``apply`` (one Redis
MULTI/EXEC or Lua script, one SQL transaction) before any of them enters the queue, so a
storage failure leaves none of them stored or queued and the request fails as a whole with
:class:`~istos.errors.StorageUnavailable`. The producer's side (cutting a batch into requests
under the frame cap) is :mod:`istos.client.batches`.

Idempotent per item: the producer chooses every job id, so a retried request (after a timeout
whose first try was in fact stored) adds nothing twice; ids the queue already holds, or that
repeat within the request, answer ``created: false``.
"""

from __future__ import annotations

from typing import Any

from ..core.state import JobRecord
from .handle import OwnerHandle


async def op_enqueue_many(owner: OwnerHandle, msg: dict[str, Any]) -> dict[str, Any]:
    """The owner's ``enqueue_many`` op (``items`` checked against protocol.SCHEMAS)."""
    return {"created": await enqueue_many(owner, msg["items"])}


async def enqueue_many(owner: OwnerHandle, items: list[dict[str, Any]]) -> list[bool]:
    """Accept the jobs of one request; per item, whether it was new (see the module doc)."""
    state, clock = owner.state, owner.node.clock
    if not owner.durable:
        now = clock.now()
        created = [state.enqueue(i["job_id"], i["body"], now,
                                 delay_s=float(i.get("delay_s", 0.0)),
                                 priority=i.get("priority", 0), dedup_s=i.get("dedup_s"),
                                 group=i.get("group"))
                   for i in items]
        state.dirty.clear()
        owner.writes.after_change()
        return created
    # Ids another request is writing right now: their outcome decides ours.
    await owner.writes.wait_pending(i["job_id"] for i in items)
    now = clock.now()
    new: dict[str, JobRecord] = {}
    created = []
    for item in items:
        jid = item["job_id"]
        if jid in new or state.holds(jid, now):
            if jid not in new:
                state.enqueue(jid, item["body"], now)  # the duplicate_enqueue event only
            created.append(False)
            continue
        new[jid] = state.new_record(jid, item["body"], now,
                                    delay_s=float(item.get("delay_s", 0.0)),
                                    priority=item.get("priority", 0),
                                    dedup_s=item.get("dedup_s"), group=item.get("group"))
        created.append(True)
    if new:
        await owner.writes.store_new(new, clock.now)
    else:
        owner.writes.after_change()
    return created

