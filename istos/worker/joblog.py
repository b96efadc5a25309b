"""The worker's log records about one job, each with the job's fields
(:func:`istos.logfields.job_fields`: ``queue``, ``job_id``, ``attempt``, ``worker``).

A failed attempt logs exactly one record, on the ``istos.worker`` logger: WARNING while
attempts remain, ERROR on the last one (the owner then dead-letters the job), both with the
exception's traceback. An attempt the function asked to retry (``Retry``) logs at INFO (ERROR
on the last attempt); a run cancelled on request and a prefetched job that never started log at
INFO; a finished attempt at DEBUG.
"""

from __future__ import annotations

import logging
from typing import Protocol

from ..errors import JobCancelled
from ..logfields import job_fields

log = logging.getLogger("istos.worker")


class Attempted(Protocol):
    """What a log record needs of a claimed job."""

    job_id: str
    attempt: int
    worker: str
    max_attempts: int


def _fields(queue: str, job: Attempted) -> dict[str, object]:
    return job_fields(queue, job.job_id, job.attempt, job.worker)


def failed(queue: str, job: Attempted, error: str, exc: BaseException) -> None:
    """The one record of an attempt whose function raised ``exc`` (``error`` as nacked)."""
    if isinstance(exc, JobCancelled):  # asked for, not a failure: the job ends cancelled
        log.info("worker %s: job %s attempt %d cancelled while running", job.worker,
                 job.job_id, job.attempt, extra=_fields(queue, job))
    elif job.attempt < job.max_attempts:
        log.warning("worker %s: job %s attempt %d of %d failed: %s", job.worker, job.job_id,
                    job.attempt, job.max_attempts, error, exc_info=exc,
                    extra=_fields(queue, job))
    else:
        log.error("worker %s: job %s failed its last attempt (%d of %d): %s", job.worker,
                  job.job_id, job.attempt, job.max_attempts, error, exc_info=exc,
                  extra=_fields(queue, job))


def retry_asked(queue: str, job: Attempted, after_s: float, error: str) -> None:
    """The function raised ``Retry``: INFO, or ERROR on the last attempt (it counts, so the
    owner dead-letters the job)."""
    if job.attempt < job.max_attempts:
        log.info("worker %s: job %s attempt %d asked to be retried in %.3g s: %s", job.worker,
                 job.job_id, job.attempt, after_s, error, extra=_fields(queue, job))
    else:
        log.error("worker %s: job %s asked to be retried on its last attempt (%d of %d): %s",
                  job.worker, job.job_id, job.attempt, job.max_attempts, error,
                  extra=_fields(queue, job))


def not_started(queue: str, job: Attempted, verdict: str) -> None:
    why = {"cancelled": "it was cancelled",
           "too_late": "its start deadline passed while it waited (handed back to expire)",
           }.get(verdict, "its lease ended while it waited")
    log.info("worker %s: job %s attempt %d not started: %s", job.worker, job.job_id,
             job.attempt, why, extra=_fields(queue, job))


def done(queue: str, job: Attempted) -> None:
    if log.isEnabledFor(logging.DEBUG):  # the hot path builds no record it would drop
        log.debug("worker %s: job %s attempt %d done", job.worker, job.job_id, job.attempt,
                  extra=_fields(queue, job))
