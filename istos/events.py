"""The JobEvent schema: one record per state change, the same in simulation and live.

The event stream is the seam between the engine and the notebook side (``istos_nb.data.frames``
and everything above it never know which world the events came from).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, Literal

# Kinds an owner emits. The simulator adds "crashed" and "restarted" for nodes.
ENQUEUED: Final = "enqueued"
DUPLICATE_ENQUEUE: Final = "duplicate_enqueue"
CLAIMED: Final = "claimed"
ACKED: Final = "acked"
NACKED: Final = "nacked"
LEASE_EXPIRED: Final = "lease_expired"
RETRY_SCHEDULED: Final = "retry_scheduled"
DEAD_LETTERED: Final = "dead_lettered"
RESULT_EXPIRED: Final = "result_expired"
PURGED: Final = "purged"
OWNER_UP: Final = "owner_up"
OWNER_DOWN: Final = "owner_down"
CRASHED: Final = "crashed"
RESTARTED: Final = "restarted"
# Heartbeats, progress and cancellation (see istos/core/leasing.py).
LEASE_EXTENDED: Final = "lease_extended"
PROGRESS: Final = "progress"
CANCEL_REQUESTED: Final = "cancel_requested"
CANCELLED: Final = "cancelled"
# Start deadlines and stored pauses (core/expiry.py, core/pauses.py; paused/resumed name no job).
EXPIRED: Final = "expired"
PAUSED: Final = "paused"
RESUMED: Final = "resumed"
UPDATED: Final = "updated"  # a waiting job edited by app.update (core/edit.py)
# Dependencies (core/deps.py): a child stored to wait for its parents; moved on to ready.
WAITING: Final = "waiting"
UNBLOCKED: Final = "unblocked"
# A batch changed at its home (owner/batches_ext.py; names no job: detail has the batch id).
BATCH: Final = "batch"
# A chord member stalled its chord by dying, or stalls it no more (features/workflow.py).
CHORD: Final = "chord"

EventKind = Literal[
    "enqueued", "duplicate_enqueue", "claimed", "acked", "nacked", "lease_expired",
    "retry_scheduled", "dead_lettered", "result_expired", "purged", "owner_up", "owner_down",
    "crashed", "restarted", "lease_extended", "progress", "cancel_requested", "cancelled",
    "expired", "paused", "resumed", "updated", "waiting", "unblocked", "batch", "chord",
]
"""The kind of a :class:`JobEvent` (one of :data:`EVENT_KINDS`)."""

EVENT_KINDS: tuple[EventKind, ...] = (
    ENQUEUED, DUPLICATE_ENQUEUE, CLAIMED, ACKED, NACKED, LEASE_EXPIRED, RETRY_SCHEDULED,
    DEAD_LETTERED, RESULT_EXPIRED, PURGED, OWNER_UP, OWNER_DOWN, CRASHED, RESTARTED,
    LEASE_EXTENDED, PROGRESS, CANCEL_REQUESTED, CANCELLED, EXPIRED, PAUSED, RESUMED, UPDATED,
    WAITING, UNBLOCKED, BATCH, CHORD,
)


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One state change of one job, as the owner that made it reports it (the event stream's
    unit: ``app.events``, a simulation's events, a live owner's published ones).

    ``t`` is the emitting node's wall clock (seconds since the epoch). ``attempt`` is the
    job's attempt number the event belongs to (0 before the first claim). ``detail`` carries
    kind-specific fields: ``priority``/``delay_s``/``ready_at`` on enqueued, ``deadline`` and
    ``lease_s`` on claimed, ``error`` on nacked/dead_lettered, ``delay_s``/``ready_at`` on
    retry_scheduled, ``deadline`` on lease_extended, ``progress``/``note`` on progress,
    what changed on updated (``app.update`` or a call joining a debounce burst),
    ``priority``/``ready_at``/``parents`` on waiting, ``delay_s``/``ready_at``/``priority``
    (and ``forced`` for an operator's promote) on unblocked, ``chord_id``/``change``
    (``stalled`` or ``resumed``)/``index``/``size``/``stalled_by`` on chord.
    """

    t: float
    node: str
    queue: str
    job_id: str
    kind: EventKind
    attempt: int = 0
    worker: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        # not dataclasses.asdict: it deep-copies, and this runs for every event recorded
        return {"t": self.t, "node": self.node, "queue": self.queue, "job_id": self.job_id,
                "kind": self.kind, "attempt": self.attempt, "worker": self.worker,
                "detail": dict(self.detail)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobEvent:
        return cls(
            t=float(d["t"]), node=d["node"], queue=d["queue"], job_id=d["job_id"],
            kind=d["kind"], attempt=int(d.get("attempt", 0)), worker=d.get("worker"),
            detail=dict(d.get("detail") or {}),
        )


Listener = Callable[[JobEvent], None]


RENEWAL_SHARE = 10
"""Heartbeat renewals keep at most ``maxlen // RENEWAL_SHARE`` places of their own in the ring."""


class _ListenersByKind(dict[str, tuple[Listener, ...]]):
    """Per kind, the listeners an event of it calls, in subscription order: worked out at
    the kind's first lookup after a change (``clear()``), then one dict lookup per event."""

    def __init__(self, listeners: list[tuple[Listener, frozenset[str] | None]]) -> None:
        super().__init__()
        self._listeners = listeners

    def __missing__(self, kind: str) -> tuple[Listener, ...]:
        found = self[kind] = tuple(fn for fn, kinds in self._listeners
                                   if kinds is None or kind in kinds)
        return found


class EventLog:
    """A bounded ring buffer of recent events plus synchronous listeners.

    Emitting costs one append when nobody listens; listeners (the simulator's recorder, the live
    publisher) are called inline and must not block. Heartbeat renewals (``lease_extended``,
    one per held job every ``lease_s / 3``) go to a smaller ring of their own: a worker holding
    thousands of long jobs would otherwise push every other event out of the ring within
    minutes. Listeners see every event either way; reads merge both rings in emission order.
    """

    def __init__(self, maxlen: int = 10_000) -> None:
        self._ring: deque[tuple[int, JobEvent]] = deque(maxlen=maxlen)
        self._renewals: deque[tuple[int, JobEvent]] = deque(
            maxlen=max(1, maxlen // RENEWAL_SHARE))
        # Each listener with the kinds it asked for (None: every kind), in subscription order,
        # and per kind the listeners it calls (worked out at its first event after a change):
        # a listener costs an event of a kind it did not ask for nothing.
        self._listeners: list[tuple[Listener, frozenset[str] | None]] = []
        self._by_kind = _ListenersByKind(self._listeners)
        self.emitted = 0

    def emit(self, event: JobEvent) -> None:
        self.emitted += 1
        kind = event.kind
        (self._renewals if kind == LEASE_EXTENDED else self._ring).append((self.emitted, event))
        for listener in self._by_kind[kind]:
            listener(event)

    def subscribe(self, listener: Listener, kinds: Collection[str] | None = None
                  ) -> Callable[[], None]:
        """Call ``listener(event)`` inline for each event emitted from now on (of ``kinds``
        only, when given), after the listeners subscribed before it; returns the function
        that unsubscribes it."""
        entry = (listener, None if kinds is None else frozenset(kinds))
        self._listeners.append(entry)
        self._by_kind.clear()

        def unsubscribe() -> None:
            if entry in self._listeners:
                self._listeners.remove(entry)
                self._by_kind.clear()

        return unsubscribe

    @property
    def has_listeners(self) -> bool:
        return bool(self._listeners)

    def newest_first(self) -> Iterator[JobEvent]:
        """Walk the ring from the newest event back, without copying it."""
        if not self._renewals:
            return (event for _, event in reversed(self._ring))
        merged = heapq.merge(reversed(self._ring), reversed(self._renewals),
                             key=lambda entry: -entry[0])
        return (event for _, event in merged)

    def snapshot_newest_first(self) -> Iterator[tuple[int, JobEvent]]:
        """The events held now, newest first, each with its number in this log (1 for the
        first event emitted, then counting up: a number names one event for the log's life).

        The rings are copied at once (one C-level copy each) and merged as the iterator is
        consumed, so the caller may yield between items while new events arrive."""
        ring = list(self._ring)
        ring.reverse()
        if not self._renewals:
            return iter(ring)
        renewals = list(self._renewals)
        renewals.reverse()
        return heapq.merge(ring, renewals, key=lambda entry: -entry[0])

    def recent(self, limit: int | None = None) -> list[JobEvent]:
        """The ring's events, oldest first (the last ``limit`` of them)."""
        if self._renewals:
            out = [event for _, event in heapq.merge(self._ring, self._renewals,
                                                     key=lambda entry: entry[0])]
        else:
            out = [event for _, event in self._ring]
        return out if limit is None else out[-limit:]
