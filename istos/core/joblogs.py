"""PURE: job logs, what ``ctx.log(message)`` lines a run wrote, kept with its attempt.

Bounds (BullMQ's ``job.log`` has none; ours keep every record small): at most
:data:`MAX_LINES` lines per attempt, each at most :data:`MAX_LINE_BYTES` UTF-8 bytes (a longer
line is cut and ends with ``...``); lines beyond the count are dropped and counted
(``logs_dropped``). The worker applies the bounds as lines are written; the owner applies them
again to what arrives (a hand-made client may send anything), so an attempt's history entry
never holds more than ~100 KiB of logs.
"""

from __future__ import annotations

from typing import Any

from ..protocol import MAX_LOG_LINE_BYTES, MAX_LOG_LINES
from .records import Attempt, JobRecord

__all__ = ["MAX_LINE_BYTES", "MAX_LINES", "clip_line", "record_logs"]

MAX_LINES = MAX_LOG_LINES
MAX_LINE_BYTES = MAX_LOG_LINE_BYTES


def clip_line(line: str) -> str:
    """``line`` cut to at most :data:`MAX_LINE_BYTES` UTF-8 bytes (marked with ``...``)."""
    if len(line) <= MAX_LINE_BYTES // 4:
        return line
    raw = line.encode("utf-8", "replace")
    if len(raw) <= MAX_LINE_BYTES:
        return line
    return raw[:MAX_LINE_BYTES - 3].decode("utf-8", "ignore") + "..."


def record_logs(rec: JobRecord, lines: Any, dropped: Any, at: Any = None) -> bool:
    """Add the lines of ``rec``'s current attempt that arrived with a heartbeat or its
    ack/nack; returns whether the attempt changed (the caller saves and writes the record).
    Anything not a list of strings is ignored, never the request it rode on.

    ``at`` (the index of the first line in the attempt's lines; today's workers send it) makes
    a resend harmless: a worker sends every line the owner has not confirmed, so lines the
    owner already has are skipped and ``dropped`` is the attempt's total. Without it (an older
    worker) the lines are appended and ``dropped`` added."""
    if not rec.history or rec.history[-1].attempt != rec.attempts:
        return False
    attempt: Attempt = rec.history[-1]
    have = attempt.logs if attempt.logs is not None else []
    count = dropped if type(dropped) is int and 0 < dropped < 1 << 31 else 0
    given = [line for line in lines if isinstance(line, str)] if isinstance(lines, list) else []
    before, was_dropped = len(have), attempt.logs_dropped or 0
    if type(at) is int and 0 <= at < 1 << 31:
        # (a gap, ``at`` past what we have, means earlier lines never arrived: keep these)
        new = given[max(0, before - at):]
        total = max(was_dropped, count + max(0, at + len(given) - MAX_LINES))
    else:
        new = given
        total = was_dropped + count + max(0, before + len(given) - MAX_LINES)
    have.extend(clip_line(line) for line in new[:max(0, MAX_LINES - before)])
    if len(have) == before and total == was_dropped:
        return False
    attempt.logs = have
    attempt.logs_dropped = total or None
    return True
