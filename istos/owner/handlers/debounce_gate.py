"""Debounce on the owner's enqueue path (the pure part is :mod:`istos.core.debounce`).

A call with a debounce key whose burst is open changes that burst's job (one durable write of
its record, write then apply: a failed write leaves it as it was); otherwise the call adds the
burst's first job through the one path of new jobs (``accept.py``), its key reserved while
that write is in flight so the next call of the burst waits for it rather than start another.
"""

from __future__ import annotations

from ...core.debounce import DebounceSpec, rebounce
from ..handle import OwnerHandle


async def join_burst(owner: OwnerHandle, body: bytes, spec: DebounceSpec) -> str | None:
    """One ``enqueue`` with a debounce key: the id of the open burst's job, which this call
    changed (``body`` and its start, one durable write), or None when no burst is open (the
    caller then adds the burst's first job through ``accept.py``).

    Raises:
        StorageUnavailable: the write failed (nothing changed).
    """
    state, writes = owner.state, owner.writes
    while (pending := state.debounce.inflight(spec.key)) is not None:
        # The writer releases the key once its write ended, stored or failed (accept.py);
        # a reservation whose write is no longer pending is stale (never spin on it).
        if writes.pending(pending) is None:
            state.debounce.release(spec.key, pending)
            continue
        await writes.wait_pending([pending])
    now = owner.node.clock.now()
    rec = state.debounce.open_job(spec.key, state.jobs)
    if rec is None:
        return None
    generation = writes.generation
    rebounce(state, rec, body, spec, now)
    await writes.commit(generation)
    return rec.job_id
