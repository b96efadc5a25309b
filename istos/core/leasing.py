"""PURE: lease renewal (heartbeats), progress and cancellation on a :class:`QueueState`.

Kept apart from ``state.py`` so the seed's transitions read as they were; these functions use
only the state's public pieces: its edits (``change``, ``note``, ``end_cancelled``) and
the lazily-cleaned lease heap, where a renewal pushes a later entry and the earlier one goes
stale because the record's ``lease_deadline`` moved on.

Renewing does not write to storage: after a restart every leased job gets a fresh full lease on
the new owner's clock anyway (``QueueState.restore``), so a stored deadline would never be read.
"""

from __future__ import annotations

import hmac
from typing import Any

from .. import events as ev
from ..context import check_progress
from .joblogs import record_logs
from .state import (
    DELAYED,
    LEASED,
    READY,
    WAITING,
    JobRecord,
    QueueState,
)

MAX_EXTEND_ITEMS = 1024  # per request: 1024 maximal items stay well inside one frame

OK, STALE, CANCEL = "ok", "stale", "cancel"


def token_matches(rec: JobRecord, token: object) -> bool:
    """Whether ``token`` is the record's current lease token: the ONE place extend and cancel
    verify a holder, so the token scheme can change without touching the callers."""
    current = rec.lease_token
    return current is not None and isinstance(token, str) and \
        hmac.compare_digest(current.encode(), token.encode())


def extend(state: QueueState, item: dict[str, Any], now: float) -> str:
    """Renew one lease for another ``lease_s`` from ``now``; record progress carried along.

    Answers ``ok`` (renewed), ``stale`` (that lease is no longer the job's: expired and
    reclaimed, settled, or unknown) or ``cancel`` (``app.cancel`` reached the job: stop it; the
    lease is not renewed). Raises :class:`InvalidProgress` for a bad progress field.
    """
    rec = state.jobs.get(str(item["job_id"]))
    if rec is None or rec.state != LEASED or not token_matches(rec, item["token"]):
        if "logs" in item and rec is not None and rec.state != LEASED:
            keep_late_logs(state, rec, item)
        return STALE
    if "progress" in item or "note" in item:
        record_progress(state, rec, now, item.get("progress"), item.get("note"))
    if "logs" in item or "logs_dropped" in item:
        keep_logs(state, rec, item)
    if rec.cancel_requested:
        return CANCEL
    rec.lease_deadline = now + state.policy.lease_s
    state.heaps.push_lease(rec, rec.lease_deadline)
    state.note(now, rec, ev.LEASE_EXTENDED, worker=rec.lease_worker,
               deadline=rec.lease_deadline)
    return OK


def keep_logs(state: QueueState, rec: JobRecord, item: dict[str, Any]) -> None:
    """Add the ``ctx.log()`` lines riding on ``item`` to ``rec``'s current attempt; the
    record is written with the request's commit (logs are kept, unlike renewals)."""
    state.change(rec, lambda r: record_logs(r, item.get("logs"), item.get("logs_dropped"),
                                            item.get("logs_at")))


def keep_late_logs(state: QueueState, rec: JobRecord, item: dict[str, Any]) -> None:
    """Lines of a lease that expired while nobody claimed the job again: its ack or nack
    would still be honoured (``QueueState.holder``), so its lines are kept too (else the
    lines of a heartbeat that arrived just late, or crossed the ack, would be lost)."""
    token = item.get("token")
    if isinstance(token, str) and state.holder(rec.job_id, token) is rec:
        keep_logs(state, rec, item)


def record_progress(state: QueueState, rec: JobRecord, now: float, fraction: object,
                    note: object) -> None:
    """Keep the latest progress on the record; one ``progress`` event when it changed."""
    frac, text = check_progress(fraction, note)
    if frac == rec.progress and text == rec.progress_note:
        return
    rec.progress, rec.progress_note = frac, text
    state.note(now, rec, ev.PROGRESS, worker=rec.lease_worker, progress=frac, note=text)


def cancel(state: QueueState, job_id: str, now: float) -> str:
    """Cancel a job: ``cancelled`` (it was waiting and is now final), ``cancelling`` (it is
    leased: marked, its holder is told and the job ends cancelled), ``too_late`` (it already
    ended: done, dead, cancelled or expired; nothing changes) or ``unknown``."""
    rec = state.jobs.get(job_id)
    if rec is None:
        return "unknown"
    if rec.state in (READY, DELAYED, WAITING):
        state.end_cancelled(rec, now)
        return "cancelled"
    if rec.state == LEASED:
        if not rec.cancel_requested:
            # Stored (a restarted owner still knows, so it never retries it); a failed write
            # puts the mark back (write, then apply).
            state.change(rec, mark_cancel_requested)
            state.note(now, rec, ev.CANCEL_REQUESTED, worker=rec.lease_worker)
        return "cancelling"
    return "too_late"  # every other state is final (done, dead, cancelled, expired)


def mark_cancel_requested(rec: JobRecord) -> bool:
    """Mark leased ``rec`` to be cancelled (its holder is told on its next heartbeat)."""
    rec.cancel_requested = True
    return True
