"""The structured fields of the engine's log records about one job.

A record about one job (a failed attempt, a lease that expired, a dead letter) carries, as
attributes set through ``extra=``, :data:`JOB_FIELDS`: ``queue``, ``job_id``, ``attempt`` (the
attempt number, 1 for the first delivery) and ``worker`` (the worker slot that held it, as the
owner's ``why`` and attempts show it; None when no worker held it). A JSON formatter that
copies a record's extra attributes writes them as fields, and a filter can tie them to a trace
or a job's page in the dashboard. The message itself stays readable without them.
"""

from __future__ import annotations

from typing import Any, Final

JOB_FIELDS: Final = ("queue", "job_id", "attempt", "worker")


def job_fields(queue: str, job_id: str, attempt: int, worker: str | None) -> dict[str, Any]:
    """The ``extra=`` of a log record about attempt ``attempt`` of job ``job_id``."""
    return {"queue": queue, "job_id": job_id, "attempt": attempt, "worker": worker}
