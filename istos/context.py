"""JobContext: what a worker may ask about the delivery it is handling, and what it may report."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NoReturn

from .core.joblogs import MAX_LINES, clip_line
from .errors import InvalidProgress, JobCancelled, Retry

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

    __slots__ = ("fraction", "note", "dirty", "cancelled", "logs", "logs_at", "logged",
                 "logs_dropped", "dropped_confirmed")

    def __init__(self) -> None:
        self.fraction: float | None = None
        self.note: str | None = None
        self.dirty = False
        self.cancelled = False
        # ctx.log() lines the owner has not confirmed yet, and the index of the first of them
        # in the attempt's lines: every heartbeat and the ack/nack send them all from that
        # index, so a send that failed (or whose reply was lost, or that crossed the ack)
        # loses nothing and the owner, which skips what it already has, keeps nothing twice.
        self.logs: list[str] = []
        self.logs_at = 0
        self.logged = 0  # lines this attempt kept so far (sent or not)
        self.logs_dropped = 0  # lines beyond the limit, in all (the owner keeps the highest)
        self.dropped_confirmed = 0

    def logs_pending(self) -> bool:
        return bool(self.logs) or self.logs_dropped != self.dropped_confirmed

    def pending_logs(self) -> tuple[int, list[str], int]:
        """(index of the first unconfirmed line, those lines, lines dropped in all) to send."""
        return self.logs_at, list(self.logs), self.logs_dropped

    def confirm_logs(self, upto: int, dropped: int) -> None:
        """The owner kept the lines before index ``upto`` and knows of ``dropped`` drops."""
        if upto > self.logs_at:
            del self.logs[:upto - self.logs_at]
            self.logs_at = upto
        self.dropped_confirmed = max(self.dropped_confirmed, dropped)


@dataclass(frozen=True, slots=True)
class JobContext:
    """The delivery's context, injected into a worker parameter named ``ctx``.

    ``job_id`` and ``queue`` name the job; ``attempt`` is 1 on the first delivery and at most
    ``max_attempts``; ``last_error`` is the error string of the attempt before (None on the
    first); ``worker`` is the slot id holding the lease (``node:function#slot``);
    ``deadline`` is when the lease ran out as claimed (epoch seconds on the owner's clock;
    heartbeats extend the lease, not this field). Frozen: the fields never change during the
    run. Its methods do no I/O.
    """

    job_id: str
    queue: str
    attempt: int
    max_attempts: int
    last_error: str | None = None
    worker: str = ""
    deadline: float | None = None
    _signals: RunSignals = field(default_factory=RunSignals, repr=False, compare=False)
    batch: Any = None
    """The batch this job is a member of (its :meth:`~istos.features.batch.Batch.add` adds
    members, also after the batch was closed), or None."""

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
        """Raise :class:`JobCancelled` if the run was cancelled (``app.cancel``) or passed its
        ``timeout_s``; return None otherwise. For thread functions, which are not cancelled
        outright: call it between steps."""
        if self._signals.cancelled:
            raise JobCancelled(f"job {self.job_id!r} of queue {self.queue!r} was cancelled")

    def log(self, message: object) -> None:
        """Add a line to this attempt's log (BullMQ's ``job.log``): synchronous, no I/O.

        Lines ride on the worker's next heartbeat or on the ack/nack, are kept with the
        attempt in the job's history (and its dead letter), and show in ``why``, ``istos
        why`` and ``LiveQueue.job()``. At most 100 lines per attempt, each cut to 1 KiB;
        lines beyond are dropped and counted (``logs_dropped``). ``message`` is ``str()``-ed.
        Never raises (beyond what ``str(message)`` raises).
        """
        sig = self._signals
        if sig.logged >= MAX_LINES:
            sig.logs_dropped += 1
            return
        sig.logged += 1
        sig.logs.append(clip_line(message if isinstance(message, str) else str(message)))

    def retry_after(self, after_s: float, reason: str | None = None) -> NoReturn:
        """Fail this attempt and retry the job after ``after_s`` seconds (capped by the
        queue's ``retry_backoff_max_s``): raises :class:`~istos.errors.Retry`, so a thread
        function can write ``ctx.retry_after(30, "429")`` as an async one raises it. Raises
        :class:`ConfigError` instead when ``after_s`` is not a finite number >= 0 or ``reason``
        is not a string."""
        raise Retry(after_s, reason)

    @property
    def is_retry(self) -> bool:
        """True when this is not the first delivery: something already failed at this job
        (or its worker died holding it)."""
        return self.attempt > 1

    @property
    def is_last_attempt(self) -> bool:
        """True on the last delivery (``attempt >= max_attempts``): raising now dead-letters
        the job rather than retrying it."""
        return self.attempt >= self.max_attempts
