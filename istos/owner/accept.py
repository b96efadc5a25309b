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

from ..core.debounce import DebounceSpec
from ..core.state import JobRecord, QueueState
from ..core.unique import UniqueSpec
from . import debounce_gate, unique_gate
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
    unique: UniqueSpec | None = None  # its unique key and scope (core/unique.py)
    debounce: DebounceSpec | None = None  # its burst's key (core/debounce.py): single enqueue


@dataclass(frozen=True, slots=True)
class Accepted:
    """What became of one new job: the id it resolved to, whether that job is new, and if
    not why (``job_id``: the queue holds that id, or keeps it reserved; ``unique_key``:
    another job holds the key)."""

    job_id: str
    created: bool
    reason: str | None = None

    def reply(self) -> dict[str, Any]:
        """The ``enqueue`` reply saying so (``reason`` only when not created)."""
        if self.created:
            return {"job_id": self.job_id, "created": True}
        return {"job_id": self.job_id, "created": False, "reason": self.reason}


async def accept_new(owner: OwnerHandle, jobs: Sequence[NewJob], *,
                     share_twin_fate: bool) -> list[bool]:
    """Accept ``jobs`` (see the module doc); per job, whether it was new.

    Raises:
        StorageUnavailable: the write failed (nothing of this call was stored or queued), or,
            with ``share_twin_fate``, the in-flight write of one of the ids failed.
    """
    return [a.created for a in await accept(owner, jobs, share_twin_fate=share_twin_fate)]


async def accept(owner: OwnerHandle, jobs: Sequence[NewJob], *,
                 share_twin_fate: bool) -> list[Accepted]:
    """As :func:`accept_new`, saying per job which job it resolved to and why.

    Raises:
        InvalidJob: a job's ``job_id`` names a job held under another unique key (nothing
            changed).
        StorageUnavailable: as :func:`accept_new`.
    """
    if len(jobs) == 1:
        job = jobs[0]
        if job.debounce is not None and owner.writes.pending(job.job_id) is None \
                and job.job_id not in owner.state.jobs:  # (a retry of a call: a duplicate)
            return [await debounce_gate.accept_debounced(owner, job, job.debounce)]
    return await accept_jobs(owner, jobs, share_twin_fate=share_twin_fate)


async def accept_jobs(owner: OwnerHandle, jobs: Sequence[NewJob], *,
                      share_twin_fate: bool) -> list[Accepted]:
    """:func:`accept` without the debounce step: every job is new or a duplicate."""
    state, writes = owner.state, owner.writes
    if any(j.unique is not None for j in jobs):
        unique_gate.check_ids(state, jobs)
        await unique_gate.wait_keys(state, writes, jobs)
    if not owner.durable:
        out = _accept_volatile(owner, jobs)
        writes.after_change()  # publishes; nothing to write (volatile storage)
        return out
    twins: set[str] = set()
    if share_twin_fate:
        for job in jobs:
            pending = writes.pending(job.job_id)
            if pending is not None:
                twins.add(job.job_id)
                await pending  # its failure is this call's failure too
    else:
        await writes.wait_pending(j.job_id for j in jobs)
    new: dict[str, JobRecord] = {}
    new_keys: dict[str, str] = {}  # unique key -> id of the new job of this call taking it
    now = owner.node.clock.now()
    created = [Accepted(j.job_id, False, "job_id") if j.job_id in twins
               else _decide(state, j, now, new, new_keys) for j in jobs]
    if new:
        await _store(owner, new, new_keys)
    elif len(twins) < len(jobs):
        writes.after_change()  # publish the duplicate_enqueue events
    return created


async def _store(owner: OwnerHandle, new: dict[str, JobRecord],
                 new_keys: dict[str, str]) -> None:
    """Store (then insert) the new records of one call, their unique and debounce keys held
    in flight until the write ended, stored or failed."""
    state = owner.state
    bursts = [(r.debounce_key, r.job_id) for r in new.values() if r.debounce_key is not None]
    for key, jid in new_keys.items():
        state.unique.reserve(key, jid)
    for key, jid in bursts:
        state.debounce.reserve(key, jid)
    try:
        await owner.writes.store_new(new, owner.node.clock.now)
    finally:
        for key, jid in new_keys.items():
            state.unique.release(key, jid)
        for key, jid in bursts:
            state.debounce.release(key, jid)


def _decide(state: QueueState, job: NewJob, now: float, new: dict[str, JobRecord],
            new_keys: dict[str, str]) -> Accepted:
    """One job of a durable call: a duplicate (its event recorded), or a record added to
    ``new`` (and its key to ``new_keys``) for the call's one write."""
    jid, spec = job.job_id, job.unique
    if spec is not None:
        held = new_keys.get(spec.key) or unique_gate.holder(state, spec, now)
        if held is not None:
            return Accepted(held, False, "unique_key")
    if jid in new or state.holds(jid, now):
        if jid not in new:
            state.enqueue(jid, job.body, now)  # the duplicate_enqueue event only
        return Accepted(jid, False, "job_id")
    # A burst's first job starts debounce_s from now (the producer sends no delay_s with it).
    delay = job.delay_s if job.debounce is None else job.debounce.debounce_s
    rec = state.new_record(jid, job.body, now, delay_s=delay, priority=job.priority,
                           meta=job.meta, dedup_s=job.dedup_s, group=job.group)
    new[jid] = rec if spec is None else spec.apply(rec)
    if job.debounce is not None:
        job.debounce.apply(rec, now)
    if spec is not None:
        new_keys[spec.key] = jid
    return Accepted(jid, True)


def _accept_volatile(owner: OwnerHandle, jobs: Sequence[NewJob]) -> list[Accepted]:
    """Without durable storage: each job enters the queue at once (or is a duplicate)."""
    state = owner.state
    now = owner.node.clock.now()
    out: list[Accepted] = []
    for j in jobs:
        if j.unique is None and j.debounce is None:
            made = state.enqueue(j.job_id, j.body, now, delay_s=j.delay_s, priority=j.priority,
                                 meta=j.meta, dedup_s=j.dedup_s, group=j.group)
            out.append(Accepted(j.job_id, True) if made else Accepted(j.job_id, False, "job_id"))
            continue
        new: dict[str, JobRecord] = {}
        out.append(_decide(state, j, now, new, {}))  # (a key: the checks of a durable call)
        for rec in new.values():
            state.insert(rec, now)
            state.dirty.append(rec)
    return out
