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

Unique and debounce keys (``unique_gate.py``, ``debounce_gate.py``): a job whose key another
job holds, or a call that joins an open debounce burst, adds nothing and resolves to that job;
a key whose first job's write is in flight makes the next call with it wait for that write. A
call without keys takes none of these steps.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ...core.debounce import DebounceSpec
from ...core.state import JobRecord, QueueState
from ...core.unique import UniqueSpec
from ...storage.base import TxStep
from ..handle import OwnerHandle
from . import debounce_gate, unique_gate


@dataclass(slots=True)  # (not frozen: a frozen dataclass is slow to build, one per job)
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
    start_by: float | None = None  # the start deadline, owner's epoch seconds (expiry.py)


class Accepted(NamedTuple):
    """What became of one new job: the id it resolved to, whether that job is new, and if
    not why (``job_id``: the queue holds that id, or keeps it reserved; ``unique_key``:
    another job holds the key; ``debounce_key``: the call joined an open burst). A tuple:
    one per enqueued job, made cheaply."""

    job_id: str
    created: bool
    reason: str | None = None


Resolved = dict[int, tuple[str, str]]
"""Of the jobs of a call not created, by index, the id each resolved to and why, when that is
not simply its own id (``job_id``): a unique key held, a debounce burst joined."""


async def accept_new(owner: OwnerHandle, jobs: Sequence[NewJob], *,
                     share_twin_fate: bool, keyed: bool | None = None,
                     also: Sequence[TxStep] = ()) -> list[bool]:
    """Accept ``jobs`` (see the module doc); per job, whether it was new. ``keyed``: whether
    a job carries a unique or debounce key, if the caller knows (None: look). ``also``: SQL
    statements that commit in the same transaction as the new jobs' records (the outbox
    relay's delete of their rows); they run only when at least one job is new and the storage
    is durable.

    Raises:
        InvalidJob: a job's ``job_id`` names a job held under another unique key (nothing
            changed).
        StorageUnavailable: the write failed (nothing of this call was stored or queued), or,
            with ``share_twin_fate``, the in-flight write of one of the ids failed.
    """
    if keyed is False or also:
        return (await accept_jobs(owner, jobs, share_twin_fate=share_twin_fate,
                                  keyed=keyed, also=also))[0]
    return (await _route(owner, jobs, share_twin_fate))[0]


async def accept_one(owner: OwnerHandle, job: NewJob) -> dict[str, Any]:
    """Accept one job (an ``enqueue``) and build the op's reply: the id it resolved to,
    whether it was new and, if not, why (``job_id``, ``unique_key`` or ``debounce_key``)."""
    created, resolved = await _route(owner, (job,), True)
    if created[0]:
        return {"job_id": job.job_id, "created": True}
    jid, why = resolved.get(0, (job.job_id, "job_id"))
    return {"job_id": jid, "created": False, "reason": why}


async def accept(owner: OwnerHandle, jobs: Sequence[NewJob], *,
                 share_twin_fate: bool) -> list[Accepted]:
    """As :func:`accept_new`, saying per job which job it resolved to and why."""
    created, resolved = await _route(owner, jobs, share_twin_fate)
    out = []
    for i, (j, made) in enumerate(zip(jobs, created)):
        jid, why = resolved.get(i, (j.job_id, "job_id"))
        out.append(Accepted(jid, True) if made else Accepted(jid, False, why))
    return out


def _route(owner: OwnerHandle, jobs: Sequence[NewJob], share_twin_fate: bool
           ) -> Coroutine[Any, Any, tuple[list[bool], Resolved]]:
    """A lone call with a debounce key goes to its burst (``debounce_gate.py``); every other
    call to :func:`accept_jobs` (a coroutine to await: no frame of its own on the hot path)."""
    if len(jobs) == 1:
        job = jobs[0]
        if job.debounce is not None and owner.writes.pending(job.job_id) is None \
                and job.job_id not in owner.state.jobs:  # (a retry of a call: a duplicate)
            return _debounced(owner, job, job.debounce)
    return accept_jobs(owner, jobs, share_twin_fate=share_twin_fate)


async def _debounced(owner: OwnerHandle, job: NewJob, spec: DebounceSpec
                     ) -> tuple[list[bool], Resolved]:
    """A lone call with a debounce key: it joins the open burst (changing its job), or adds
    the burst's first job."""
    joined = await debounce_gate.join_burst(owner, job.body, spec)
    if joined is None:
        return await accept_jobs(owner, [job], share_twin_fate=True)
    return [False], {0: (joined, "debounce_key")}


async def accept_jobs(owner: OwnerHandle, jobs: Sequence[NewJob], *, share_twin_fate: bool,
                      keyed: bool | None = None, also: Sequence[TxStep] = ()
                      ) -> tuple[list[bool], Resolved]:
    """Every job is new or a duplicate (no debounce step): per job whether it was new, and
    for those not created the id they resolved to when not their own (``also``: see
    :func:`accept_new`)."""
    state, writes = owner.state, owner.writes
    if keyed is None:
        keyed = (jobs[0].unique is not None or jobs[0].debounce is not None) \
            if len(jobs) == 1 else any(j.unique is not None or j.debounce is not None
                                       for j in jobs)
    if keyed:
        unique_gate.check_ids(state, jobs)
        await unique_gate.wait_keys(state, writes, jobs)
    resolved: Resolved = {}
    if not owner.durable:
        now = owner.node.clock.now()
        if keyed:
            created = _accept_keyed(state, jobs, now, resolved)
        else:
            created = [state.enqueue(j.job_id, j.body, now, delay_s=j.delay_s,
                                     priority=j.priority, meta=j.meta, dedup_s=j.dedup_s,
                                     group=j.group, start_by=j.start_by) for j in jobs]
        writes.after_change()  # publishes; nothing to write (volatile storage)
        return created, resolved
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
    created = [j.job_id not in twins and _decide(state, j, now, new, new_keys, resolved, i)
               for i, j in enumerate(jobs)] if keyed else \
        _decide_plain(state, jobs, twins, now, new)
    if new and keyed:
        await _store(owner, new, new_keys, also)
    elif new:
        await writes.store_new(new, owner.node.clock.now, also=also)
    elif len(twins) < len(jobs):
        writes.after_change()  # publish the duplicate_enqueue events
    return created, resolved


async def _store(owner: OwnerHandle, new: dict[str, JobRecord],
                 new_keys: dict[str, str], also: Sequence[TxStep] = ()) -> None:
    """Store (then insert) the new records of one call, their unique and debounce keys held
    in flight until the write ended, stored or failed."""
    state = owner.state
    bursts = [(r.debounce_key, r.job_id) for r in new.values() if r.debounce_key is not None]
    for key, jid in new_keys.items():
        state.unique.reserve(key, jid)
    for key, jid in bursts:
        state.debounce.reserve(key, jid)
    try:
        await owner.writes.store_new(new, owner.node.clock.now, also=also)
    finally:
        for key, jid in new_keys.items():
            state.unique.release(key, jid)
        for key, jid in bursts:
            state.debounce.release(key, jid)


def _decide(state: QueueState, job: NewJob, now: float, new: dict[str, JobRecord],
            new_keys: dict[str, str], resolved: Resolved, index: int) -> bool:
    """One job of a call: a duplicate (its event recorded; a held key noted in ``resolved``),
    or a record added to ``new`` (and its key to ``new_keys``) for the call's one write."""
    jid, spec = job.job_id, job.unique
    if spec is not None:
        held = new_keys.get(spec.key) or unique_gate.holder(state, spec, now)
        if held is not None:
            resolved[index] = (held, "unique_key")
            return False
    if jid in new or state.holds(jid, now):
        if jid not in new:
            state.enqueue(jid, job.body, now)  # the duplicate_enqueue event only
        return False
    # A burst's first job starts debounce_s from now (the producer sends no delay_s with it).
    delay = job.delay_s if job.debounce is None else job.debounce.debounce_s
    rec = state.new_record(jid, job.body, now, delay_s=delay, priority=job.priority,
                           meta=job.meta, dedup_s=job.dedup_s, group=job.group,
                           start_by=job.start_by)
    new[jid] = rec if spec is None else spec.apply(rec)
    if job.debounce is not None:
        job.debounce.apply(rec, now)
    if spec is not None:
        new_keys[spec.key] = jid
    return True


def _decide_plain(state: QueueState, jobs: Sequence[NewJob], twins: set[str], now: float,
                  new: dict[str, JobRecord]) -> list[bool]:
    """:func:`_decide` for a call whose jobs carry no key, one loop for the call (every plain
    enqueue runs it): per job whether it is new (its record added to ``new``)."""
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
    return created


def _accept_keyed(state: QueueState, jobs: Sequence[NewJob], now: float,
                  resolved: Resolved) -> list[bool]:
    """Without durable storage, a call with keys: each job enters the queue at once (or is
    a duplicate), decided as in a durable call."""
    created = []
    for i, j in enumerate(jobs):
        new: dict[str, JobRecord] = {}
        created.append(_decide(state, j, now, new, {}, resolved, i))
        for rec in new.values():
            state.insert(rec, now)
            state.dirty.append(rec)
    return created
