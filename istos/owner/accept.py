"""Accepting new jobs: the one owner-side path of ``enqueue`` and ``enqueue_many``.

Write, then apply: with durable storage every new record of one call is stored in one write
(one Redis MULTI/EXEC or Lua script, one SQL transaction) before any of them enters the queue,
so a storage failure leaves none of them stored or queued and the call raises
:class:`~istos.errors.StorageUnavailable`. Without durable storage the jobs enter the queue at
once and their events are published.

Idempotent per job: an id the queue already holds (or holds reserved, a dedup window), or that
repeats within the call, is answered ``False`` and records a ``duplicate_enqueue`` event only.
An id whose first write is still in flight (a producer's retry racing its first try) is decided
by that write, in one of two ways, which the caller chooses:

- ``share_twin_fate=True`` (a single enqueue): the in-flight write answers for it: ``False``
  once it is stored, and its failure is this call's failure too;
- ``share_twin_fate=False`` (a batch): the call waits for the in-flight writes, then checks the
  queue again, so one twin's failed write does not fail the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..core.state import JobRecord
from ..storage.base import TxStep
from .handle import OwnerHandle


@dataclass(frozen=True, slots=True)
class NewJob:
    """One job to accept, its fields checked already (by the op's schema or the caller)."""

    job_id: str
    body: bytes
    delay_s: float = 0.0
    priority: int = 0
    meta: dict[str, Any] | None = None
    dedup_s: float | None = None
    group: str | None = None
    start_by: float | None = None  # the start deadline, owner's epoch seconds (expiry.py)


async def accept_new(owner: OwnerHandle, jobs: Sequence[NewJob], *,
                     share_twin_fate: bool, also: Sequence[TxStep] = ()) -> list[bool]:
    """Accept ``jobs`` (see the module doc); per job, whether it was new.

    ``also``: SQL statements that commit in the same transaction as the new jobs' records
    (the outbox relay's delete of their rows); they run only when at least one job is new and
    the storage is durable.

    Raises:
        StorageUnavailable: the write failed (nothing of this call was stored or queued), or,
            with ``share_twin_fate``, the in-flight write of one of the ids failed.
    """
    state, clock, writes = owner.state, owner.node.clock, owner.writes
    if not owner.durable:
        now = clock.now()
        created = [state.enqueue(j.job_id, j.body, now, delay_s=j.delay_s,
                                 priority=j.priority, meta=j.meta, dedup_s=j.dedup_s,
                                 group=j.group, start_by=j.start_by) for j in jobs]
        writes.after_change()  # publishes; nothing to write (volatile storage)
        return created
    twins: set[str] = set()
    if share_twin_fate:
        for job in jobs:
            pending = writes.pending(job.job_id)
            if pending is not None:
                twins.add(job.job_id)
                await pending  # its failure is this call's failure too
    else:
        await writes.wait_pending(j.job_id for j in jobs)
    now = clock.now()
    new: dict[str, JobRecord] = {}
    created = []
    for job in jobs:
        jid = job.job_id
        if jid in twins:
            created.append(False)
        elif jid in new or state.holds(jid, now):
            if jid not in new:
                state.enqueue(jid, job.body, now)  # the duplicate_enqueue event only
            created.append(False)
        else:
            new[jid] = state.new_record(jid, job.body, now, delay_s=job.delay_s,
                                        priority=job.priority, meta=job.meta,
                                        dedup_s=job.dedup_s, group=job.group,
                                        start_by=job.start_by)
            created.append(True)
    if new:
        await writes.store_new(new, clock.now, also=also)
    elif len(twins) < len(jobs):
        writes.after_change()  # publish the duplicate_enqueue events
    return created

