"""Unique keys on the owner's enqueue path (the pure index is :mod:`istos.core.unique`).

The owner serialises its queue's enqueues on one event loop, so deciding whether a key is held
and reserving it for a new job happen with no await in between. The one window left is the new
job's durable write: until it is stored the job is not in the queue, so the key is reserved as
*in flight* meanwhile, and an enqueue with that key waits for the write (stored: the new job
holds the key; failed: the key is free again) before it decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ... import events as ev
from ...core.state import QueueState
from ...core.unique import UniqueSpec
from ...errors import InvalidJob
from ...events import JobEvent
from ..persistence.write_path import WritePath


class Keyed(Protocol):
    """A new job as the accept path sees it (``accept.NewJob``)."""

    @property
    def job_id(self) -> str: ...

    @property
    def unique(self) -> UniqueSpec | None: ...


def check_ids(state: QueueState, jobs: Sequence[Keyed]) -> None:
    """Refuse, before anything changes, a job whose ``job_id`` names a job the queue holds
    under another unique key (or none): the id and the key would mean different jobs.

    Raises:
        InvalidJob: naming ``unique_key`` and the id.
    """
    for job in jobs:
        spec = job.unique
        if spec is None:
            continue
        rec = state.jobs.get(job.job_id)
        if rec is not None and rec.unique_key != spec.key:
            raise InvalidJob(
                f"queue {state.queue!r}: unique_key {spec.key[:60]!r}: job_id "
                f"{job.job_id[:60]!r} is a job the queue holds with "
                + ("no unique key" if rec.unique_key is None
                   else f"unique key {rec.unique_key[:60]!r}"))


async def wait_keys(state: QueueState, writes: WritePath, jobs: Sequence[Keyed]) -> None:
    """Wait until no new job with one of these jobs' keys is being written."""
    keys = [j.unique.key for j in jobs if j.unique is not None]
    while True:
        held = [(k, jid) for k in keys if (jid := state.unique.inflight(k)) is not None]
        if not held:
            return
        # The writer releases its keys once its write ended, stored or failed (accept.py);
        # a reservation whose write is no longer pending is stale (never spin on it).
        if all(writes.pending(jid) is None for _, jid in held):
            for k, jid in held:
                state.unique.release(k, jid)
            continue
        await writes.wait_pending([jid for _, jid in held])


def holder(state: QueueState, spec: UniqueSpec, now: float) -> str | None:
    """The id of the job holding ``spec.key`` (a ``duplicate_enqueue`` event is recorded on
    it, saying which key and scope), or None when a new job may take the key."""
    jid = state.unique.holder(spec.key, state.jobs, now)
    if jid is not None:
        scope = state.unique.scope_of(jid, state.jobs)
        rec = state.jobs.get(jid)
        state.events.append(JobEvent(now, state.node, state.queue, jid, ev.DUPLICATE_ENQUEUE,
                                     0 if rec is None else rec.attempts, None,
                                     {"unique_key": spec.key, "unique": scope}))
    return jid
