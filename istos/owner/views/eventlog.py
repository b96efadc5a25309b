"""The owner's log records about one job, from the events it publishes (so only after the
change is durable), each with the job's fields (:func:`istos.logfields.job_fields`).

On the ``istos.owner`` logger, at WARNING: a lease that expired (its worker died, stalled or
lost the owner; the job goes back to ready, or to the dead letters when out of attempts) and a
job dead-lettered. A failed attempt itself is the worker's record, not the owner's: each
attempt logs once.
"""

from __future__ import annotations

import logging
from typing import Any

from ... import events as ev
from ...core.records import JobRecord
from ...events import JobEvent
from ...logfields import job_fields

log = logging.getLogger("istos.owner")

LOGGED = frozenset({ev.LEASE_EXPIRED, ev.DEAD_LETTERED})
"""The event kinds the owner logs (a set lookup per published event, nothing more)."""


def fields_of(queue: str, job_id: str, rec: JobRecord | None) -> dict[str, Any]:
    """The job's fields from its record: its current attempt and the worker that held it
    last (None for a job no worker claimed, or one the owner no longer holds)."""
    if rec is None:
        return job_fields(queue, job_id, 0, None)
    worker = rec.history[-1].worker if rec.history else None
    return job_fields(queue, job_id, rec.attempts, worker)


def log_event(queue: str, event: JobEvent, rec: JobRecord | None) -> None:
    """Log ``event`` (one of :data:`LOGGED`) of the job whose record is ``rec``."""
    fields = fields_of(queue, event.job_id, rec)
    fields["attempt"] = event.attempt  # the attempt the event belongs to
    if event.worker is not None:
        fields["worker"] = event.worker
    if event.kind == ev.LEASE_EXPIRED:
        log.warning("queue %s: job %s attempt %d: the lease of %s expired", queue,
                    event.job_id, event.attempt, fields["worker"], extra=fields)
    else:
        log.warning("queue %s: job %s dead-lettered after attempt %d: %s", queue,
                    event.job_id, event.attempt, event.detail.get("error"), extra=fields)
