"""Typed errors. Every error class Istos defines derives from :class:`IstosError`.

One concept at two layers: the engine's error tree here; the simulator's one error
(``istos_nb/sim/errors.py``) derives from its root.

A bad argument or option, a failed request and a refused write each raise one of the classes
below. Where an error is also a builtin (``ValueError``, ``LookupError``, ``AssertionError``,
``RuntimeError``), it derives from both, so ``except ValueError`` and ``except IstosError``
each catch it. Python's own ``TypeError`` (a value of the wrong type, such as a non-callable
given to ``Depends``) and ``KeyError`` (a frame lacking a column) keep their meaning; the
docstrings that raise them say so. The classes below are exported from ``istos`` unless a
module is named.

The tree::

    IstosError
    ├── ConfigError (also ValueError)        bad option or argument, raised before anything is sent
    │   ├── CronError                         invalid cron expression (names the field)
    │   ├── HAConfigError                     ha=True without shared storage
    │   ├── OwnerConflict                     another node already owns this non-HA queue
    │   ├── MeshUnreachable                   a client-mode session reached no router
    │   ├── UnsupportedOption                 an option the called path does not take (a pipeline's)
    │   └── UsageError                        istos.ops.cli: bad command-line usage (exit 2)
    ├── InvalidJob (also ValueError)          body cannot be encoded, or is too large
    │   └── ParentFailed                      enqueue(after=): a parent already dead or cancelled
    ├── QueueNotFound                         the owner does not serve that queue
    ├── JobNotFound (also LookupError)        the queue holds no job (or dead job) with that id
    │   └── UnknownJob                        istos.ops.cli: the same, as the CLI reports it
    ├── OwnerUnavailable                      no owner answered within the timeout
    ├── NotAccepted                           pipelined jobs whose acceptance was not confirmed
    ├── CapacityExceeded                      an owner holds as many of something as it may
    ├── StorageUnavailable                    durable storage refused a write; nothing was accepted
    │   └── FencedOut                         an HA leader's write refused: it lost its epoch
    ├── ProtocolError                         malformed or unsupported wire message
    │   └── ReplyTooLarge                     istos.client.call: a reply above the cap
    ├── AdminDisabled                         admin action on a queue declared without admin=True
    ├── BatchAddFailed                        istos.features.batch: a member counted, not enqueued
    ├── RemoteError                           the owner answered with an error of no known type
    ├── InvalidProgress (also ValueError)     ctx.progress() with a bad fraction or note
    ├── JobTimeout                            a run exceeded its worker's timeout_s
    ├── JobCancelled                          the job was cancelled (ctx.check_cancelled())
    ├── Retry                                 raised by a worker: retry after after_s (a nack)
    ├── PayloadCodecError                     istos.payload: a body its codecs cannot decode
    ├── OffloadUnavailable                    istos.offload: the object store of large bodies failed
    ├── Suspended                             istos.client.blocking: internal, met a wait
    ├── TransportError                        istos.transport.base: the mesh failed a call
    │   ├── TransportTimeout                  no reply in time (callers see OwnerUnavailable)
    │   └── NoResponder                       nobody serves the key (retried, then OwnerUnavailable)
    ├── TraceFormatError (also ValueError)    istos.tracefile: a trace file this version cannot read
    ├── ScenarioError (also ValueError)       istos_nb.sim: a simulation asks for the impossible
    ├── InvariantViolation (also AssertionError)  istos_nb.sim: SimResult.check(strict=True) failed
    └── VirtualLoopError (also RuntimeError)  istos_nb.sim.vloop: the virtual event loop stopped
        ├── VirtualDeadlock                   no task can ever resume
        └── VirtualLoopInterrupted            the run was asked to stop
"""

from __future__ import annotations

import math
from typing import Any


class IstosError(Exception):
    """Root of every error Istos raises."""


class ConfigError(IstosError, ValueError):
    """An option or argument is invalid: at declaration, or in a call before anything was
    sent. The message names it. A ``ValueError`` too."""


class MeshUnreachable(ConfigError):
    """A client-mode Zenoh session reached no router: none listens at the configured
    ``connect`` endpoints, or (with TLS) the router refused this node's certificate. A
    :class:`ConfigError` too, as the config names where to connect."""


class CronError(ConfigError):
    """A cron expression is invalid; the message names the bad field."""


class HAConfigError(ConfigError):
    """``ha=True`` needs storage shared between replicas (Redis or SQLAlchemy)."""


class OwnerConflict(ConfigError):
    """Another node already serves this queue (declared without ``ha=True``) on the mesh; a
    second owner would lease its jobs twice, so this one refuses to serve. Names the node."""


class UnsupportedOption(ConfigError):
    """An option the called path does not take, though a sibling call does (an ``app.enqueue``
    option given to a pipeline's ``enqueue``). ``option`` names it; the message says why and
    what to use instead. Nothing was handed over or sent. A :class:`ConfigError` too."""

    def __init__(self, option: str, why: str) -> None:
        self.option = option
        self.why = why
        super().__init__(f"{option!r} is not supported here: {why}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.option, self.why))


class InvalidJob(IstosError, ValueError):
    """A job body could not be encoded, or exceeds the size limit. Nothing was sent."""


class ParentFailed(InvalidJob):
    """``enqueue(..., after=[...])`` with ``on_parent_failure="cancel"`` named a parent that
    already ended dead or cancelled (or expired): nothing was enqueued. ``parent`` is its
    ``(queue, job_id)``, ``state`` its end."""

    def __init__(self, message: str, parent: tuple[str, str] = ("", ""),
                 state: str = "") -> None:
        super().__init__(message)
        self.parent = parent
        self.state = state


class QueueNotFound(IstosError):
    """The owner reached does not serve the named queue."""


class JobNotFound(IstosError, LookupError):
    """The queue holds no job with that id (or, for a resubmit or a revive, no dead job
    with it); the
    message names the queue and the id. A ``LookupError`` too."""


class OwnerUnavailable(IstosError):
    """No owner of the queue answered within the timeout."""


class NotAccepted(IstosError):
    """Jobs of a pipeline (``app.pipeline``, ``SyncProducer.pipeline``) whose acceptance was
    not confirmed when it was flushed.

    ``job_ids``: every such id, in the order handed over; ``causes``: each one's error (the
    typed error its request failed with); ``refused``: those the owner refused (nothing of
    them stored: every cause but :class:`OwnerUnavailable`); ``unanswered``: the others (no
    answer in time, or the request was cancelled: each may or may not have been stored;
    enqueue it again with the same id to make sure); ``accepted``: the ids of the same flush
    that were accepted. The message names the queue, the counts and the first ids.
    """

    def __init__(self, queue: str, causes: dict[str, IstosError], accepted: list[str]) -> None:
        self.queue = queue
        self.causes = dict(causes)
        self.job_ids = list(causes)
        self.accepted = list(accepted)
        self.unanswered = [j for j, e in causes.items() if isinstance(e, OwnerUnavailable)]
        self.refused = [j for j, e in causes.items() if not isinstance(e, OwnerUnavailable)]
        first = next(iter(causes.values()), None)
        shown = ", ".join(self.job_ids[:5]) + (", ..." if len(self.job_ids) > 5 else "")
        super().__init__(
            f"queue {queue!r}: {len(self.job_ids)} job(s) not confirmed accepted "
            f"({len(self.refused)} refused, {len(self.unanswered)} unanswered; "
            f"{len(self.accepted)} accepted): {shown}; first cause: {first}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.queue, self.causes, self.accepted))


class CapacityExceeded(IstosError):
    """An owner already holds as many of what the request would add as it may (unused chord
    reservations of a queue); nothing was added. The message names the limit: retry later."""


class StorageUnavailable(IstosError):
    """The storage backend failed; the operation was not accepted."""


class FencedOut(StorageUnavailable):
    """An HA leader's write was refused because another replica now holds the leadership epoch.

    Nothing was written; the replica stops serving and reloads before it serves again.
    """


class ProtocolError(IstosError):
    """A wire message was malformed, oversized or of an unsupported version."""


class AdminDisabled(IstosError):
    """An admin action reached a queue declared without ``admin=True``."""


class RemoteError(IstosError):
    """The owner answered a request with an error it could not map to a typed one."""


class InvalidProgress(IstosError, ValueError):
    """``ctx.progress()`` got a fraction outside [0, 1] (or not finite) or an oversized note."""


class JobTimeout(IstosError):
    """A run took longer than its worker's ``timeout_s``; the attempt is nacked with this."""


class JobCancelled(IstosError):
    """The job was cancelled (``app.cancel``); raised by ``ctx.check_cancelled()``."""


class PayloadCodecError(IstosError):
    """A job body or result that the reader's payload codecs cannot decode: other codecs
    than its own, an unknown or wrong key, or tampered bytes (``istos.payload``)."""


class OffloadUnavailable(IstosError):
    """The object store that holds large bodies failed to store or read one
    (``istos.offload``): at enqueue, nothing was sent; on a worker, the attempt fails and the
    job is retried."""


class Retry(IstosError):
    """Raise from a worker to fail this attempt and retry the job after ``after_s`` seconds
    (capped by the queue's ``retry_backoff_max_s``) instead of the backoff curve, as for an
    HTTP 429 with ``Retry-After``. The attempt counts like any nack (dead-lettered after
    ``max_attempts``); ``reason`` is recorded in the job's history.

    ``after_s`` must be a finite number >= 0, else :class:`ConfigError` names it.
    """

    def __init__(self, after_s: float, reason: str | None = None) -> None:
        if isinstance(after_s, bool) or not isinstance(after_s, (int, float)) \
                or not math.isfinite(after_s) or after_s < 0:
            raise ConfigError(f"Retry(after_s=...) must be a finite number >= 0, got "
                              f"{after_s!r}")
        if reason is not None and not isinstance(reason, str):
            raise ConfigError(f"Retry(reason=...) must be a string or None, got "
                              f"{type(reason).__name__}")
        self.after_s = float(after_s)
        self.reason = reason
        super().__init__(f"retry after {self.after_s:g} s" + (f": {reason}" if reason else ""))
