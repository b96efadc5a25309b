"""JobContext: what a worker may ask about the delivery it is handling, and what it may report."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .errors import InvalidProgress, JobCancelled

MAX_NOTE_CHARS = 256  # a progress note rides on every heartbeat: keep it a status line


def check_progress(fraction: object = None, note: object = None) -> tuple[float | None,
                                                                         str | None]:
    """Validate a progress report; raise :class:`InvalidProgress` naming the bad part."""
    if fraction is not None:
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) \
                or not math.isfinite(fraction) or not 0.0 <= fraction <= 1.0:
            raise InvalidProgress(f"progress fraction must be a finite number in [0, 1], "
                                  f"got {fraction!r}")
        fraction = float(fraction)
    if note is not None:
        if not isinstance(note, str):
            raise InvalidProgress(f"progress note must be a string, got {type(note).__name__}")
        if len(note) > MAX_NOTE_CHARS:
            raise InvalidProgress(f"progress note is {len(note)} characters; the limit is "
                                  f"{MAX_NOTE_CHARS}")
    return fraction, note


class RunSignals:
    """What a run and its worker share: the latest progress (written by the function, read by
    the heartbeat) and the cancellation flag (written by the worker, read by the function).
    Plain attribute writes: cheap, and safe enough across the worker thread under the GIL."""

    __slots__ = ("fraction", "note", "dirty", "cancelled")

    def __init__(self) -> None:
        self.fraction: float | None = None
        self.note: str | None = None
        self.dirty = False
        self.cancelled = False


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
    _signals: RunSignals = field(default_factory=RunSignals, repr=False, compare=False)

    def progress(self, fraction: float | None = None, note: str | None = None) -> None:
        """Report how far the run got (``fraction`` in [0, 1]) and/or a short status ``note``.

        Synchronous and cheap (no I/O): the latest value rides on the worker's next heartbeat
        and shows in ``why``/``jobs`` and as a ``progress`` event. Raises
        :class:`InvalidProgress` for a fraction outside [0, 1] or not finite, or a note longer
        than 256 characters.
        """
        frac, text = check_progress(fraction, note)
        sig = self._signals
        sig.fraction, sig.note, sig.dirty = frac, text, True

    @property
    def cancelled(self) -> bool:
        """True once the run was cancelled (``app.cancel``) or passed its ``timeout_s``. An
        async function is cancelled outright; a thread function should look at this."""
        return self._signals.cancelled

    def check_cancelled(self) -> None:
        """Raise :class:`JobCancelled` if the run was cancelled or timed out (see above)."""
        if self._signals.cancelled:
            raise JobCancelled(f"job {self.job_id!r} of queue {self.queue!r} was cancelled")

    @property
    def is_retry(self) -> bool:
        """Something already failed at this job (or its worker died holding it)."""
        return self.attempt > 1

    @property
    def is_last_attempt(self) -> bool:
        """Raising now dead-letters the job rather than retrying it."""
        return self.attempt >= self.max_attempts
