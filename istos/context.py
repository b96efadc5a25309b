"""JobContext: what a worker may ask about the delivery it is handling."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class JobContext:
    """The delivery's context, injected into a worker parameter named ``ctx``.

    ``attempt`` is 1 on the first delivery; ``last_error`` is the error string of the attempt
    before (None on the first).
    """

    job_id: str
    queue: str
    attempt: int
    max_attempts: int
    last_error: str | None = None
    worker: str = ""
    deadline: float | None = None

    @property
    def is_retry(self) -> bool:
        """Something already failed at this job (or its worker died holding it)."""
        return self.attempt > 1

    @property
    def is_last_attempt(self) -> bool:
        """Raising now dead-letters the job rather than retrying it."""
        return self.attempt >= self.max_attempts
