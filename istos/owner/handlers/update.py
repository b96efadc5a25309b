"""The ``update`` op: edit a waiting job (``app.update``), the owner's side of
:mod:`istos.core.edit`.

On the ``produce`` role: a producer may change what it enqueued while the job waits; a change
of a job's fate (cancel, resubmit, revive, purge) stays on ``admin``. One durable write (write, then
apply): a failed write puts the job back as it was and the request gets
:class:`~istos.errors.StorageUnavailable`, never a half-applied edit.
"""

from __future__ import annotations

from typing import Any

from ...core.edit import UPDATED, update_job
from ...errors import InvalidJob
from ..handle import OwnerHandle


async def op_update(owner: OwnerHandle, msg: dict[str, Any]) -> dict[str, Any]:
    """``{job_id, body?, delay_s? | run_at?, priority?}`` (checked by protocol.SCHEMAS) ->
    ``{status}``: ``updated``, ``too_late`` or ``unknown``.

    Raises:
        InvalidJob: both ``delay_s`` and ``run_at``, or nothing to change (nothing changed).
        StorageUnavailable: the write failed (the job is as it was).
    """
    ready_at = msg.get("run_at")
    delay = msg.get("delay_s")
    if delay is not None and ready_at is not None:
        raise InvalidJob("update takes delay_s or run_at, not both")
    if all(msg.get(f) is None for f in ("body", "delay_s", "run_at", "priority")):
        raise InvalidJob("update needs body, delay_s, run_at or priority")
    now = owner.node.clock.now()
    if delay is not None:
        ready_at = now + float(delay)
    status = update_job(owner.state, msg["job_id"], now, body=msg.get("body"),
                        ready_at=None if ready_at is None else float(ready_at),
                        priority=msg.get("priority"))
    if status == UPDATED:
        await owner.writes.commit()
        # A job made ready at once wakes idle workers, as a new job would.
        rec = owner.state.jobs.get(msg["job_id"])
        if rec is not None and rec.state == "ready" and (delay is not None or
                                                         msg.get("run_at") is not None):
            owner.nudge(1)
    else:
        owner.writes.after_change()
    return {"status": status}
