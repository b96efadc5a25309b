"""Bulk enqueue, the owner's side: one ``enqueue_many`` request's jobs in one write.

Write, then apply: the jobs go through the owner's one path of new jobs (``accept.py``), all of
them in one storage write before any of them enters the queue, so a storage failure leaves none
of them stored or queued and the request fails as a whole with
:class:`~istos.errors.StorageUnavailable`. The producer's side (cutting a batch into requests
under the frame cap) is :mod:`istos.client.batches`.

Idempotent per item: the producer chooses every job id, so a retried request (after a timeout
whose first try was in fact stored) adds nothing twice; ids the queue already holds, or that
repeat within the request, answer ``created: false``; an id whose first write is in flight is
checked again once that write ended (its failure does not fail the batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...core.expiry import start_by_of
from ...storage.base import TxStep
from ...wire_lifecycle import unique_spec
from ..handle import OwnerHandle
from .accept import NewJob, accept, accept_new


async def op_enqueue_many(owner: OwnerHandle, msg: dict[str, Any]) -> dict[str, Any]:
    """The owner's ``enqueue_many`` op (``items`` checked against protocol.SCHEMAS). With
    unique keys the reply also lists the id each item resolved to (``job_ids``): a key held
    by another job resolves to that job."""
    items = msg["items"]
    if not any("unique" in i for i in items):
        return {"created": await enqueue_many(owner, items)}
    now = owner.node.clock.now()
    jobs = [NewJob(i["job_id"], i["body"], float(i.get("delay_s", 0.0)), i.get("priority", 0),
                   i.get("meta"), i.get("dedup_s"), i.get("group"),
                   unique=unique_spec(i.get("unique")), start_by=start_by_of(i, now))
            for i in items]
    done = await accept(owner, jobs, share_twin_fate=False)
    return {"created": [a.created for a in done], "job_ids": [a.job_id for a in done]}


async def enqueue_many(owner: OwnerHandle, items: list[dict[str, Any]], *,
                       also: Sequence[TxStep] = ()) -> list[bool]:
    """Accept the jobs of one request; per item, whether it was new (see the module doc). An
    item's ``meta`` is a trace context only (``protocol.enqueue_item`` refuses any other).
    ``also``: see :func:`~istos.owner.handlers.accept.accept_new`. Raises StorageUnavailable when
    the write failed (nothing stored)."""
    now = owner.node.clock.now()
    jobs = [NewJob(i["job_id"], i["body"], float(i.get("delay_s", 0.0)), i.get("priority", 0),
                   i.get("meta"), i.get("dedup_s"), i.get("group"),
                   start_by=start_by_of(i, now)) for i in items]
    return await accept_new(owner, jobs, share_twin_fate=False, keyed=False, also=also)
