"""The job-log invariant: what the owners kept of ``ctx.log`` lines is what handlers wrote.

Logs are not in the event stream, so this check reads two other rows of the record: the
simulator's ledger (``logledger.py``: each handler attempt's lines, as written, noted in the
handler's own call) and the logs the owners kept at the end (the final records' history, dead
letters included). It keeps its own model of the bounds (the promise, ``protocol.py``'s caps;
it never calls the engine's cut) and finds, per kept attempt:

- a line that attempt never wrote (a planted line, or another attempt's);
- lines out of order (or one kept twice);
- more than ``MAX_LINES`` lines, or a line over ``MAX_LINE_BYTES`` UTF-8 bytes (a cut line
  must be a prefix of the written one, ending with ``...``);
- lines of a settled attempt (an ``acked`` or ``nacked`` event of that attempt) missing: every
  written line is kept or counted in ``logs_dropped``, and ``logs_dropped`` counts only lines
  beyond the first ``MAX_LINES``.

What may be lost, and why: lines travel only on heartbeats and on the ack/nack. An attempt that
was never settled (its lease expired: the worker crashed, froze, lost its ack, or was
partitioned; or it was released at shutdown) keeps the lines of the heartbeats the owner took
while that lease was its latest, and loses those written after the last one (every line, for a
worker without heartbeats). Its kept lines must still be a prefix of what it wrote, in order.
Attempts forgotten by then (acked without ``keep_results``, a restarted volatile owner, a
history entry past ``history_limit``) are not checked: nothing of them was kept.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from istos.protocol import MAX_LOG_LINE_BYTES, MAX_LOG_LINES

from .run_record import Finding, RunRecord, summary

NAME = "job logs kept as their attempts wrote them"
CUT_MARK = "..."


def job_log_finding(rec: RunRecord) -> Finding:
    if not any(row["lines"] for row in rec.logs):
        return Finding(NAME, True, "no handler logged")
    written: dict[tuple[str, str, int], list[list[str]]] = defaultdict(list)
    for row in rec.logs:
        written[(row["queue"], row["job_id"], row["attempt"])].append(row["lines"])
    settled = {(e["queue"], e["job_id"], e["attempt"]) for e in rec.events
               if e["kind"] in ("acked", "nacked")}
    bad: list[str] = []
    checked = 0
    for kept in rec.kept_logs:
        key = (kept["queue"], kept["job_id"], kept["attempt"])
        checked += 1
        problems = _caps(kept["logs"])
        runs = written.get(key, [])
        if kept["logs"] and not runs:
            problems.append(f"{len(kept['logs'])} line(s) kept, but that attempt wrote none")
        elif runs:
            # Two runs share an attempt number when one was handed back unfinished (released:
            # the try did not count) or the id was enqueued again: one of them must explain it.
            verdicts = [_against(kept, lines, key in settled) for lines in runs]
            if all(verdicts):
                problems.append(min(verdicts, key=len)[0])
        bad += [f"{kept['job_id']} attempt {kept['attempt']}: {p}" for p in problems]
    if not checked:
        return Finding(NAME, True, "no log kept to check (an acked job is forgotten with its "
                                   "logs unless its queue keeps results)")
    detail = summary(bad) if bad else f"{checked} kept attempt log(s) match what was written"
    return Finding(NAME, not bad, detail)


def _caps(logs: list[str]) -> list[str]:
    out = []
    if len(logs) > MAX_LOG_LINES:
        out.append(f"{len(logs)} lines kept (at most {MAX_LOG_LINES})")
    longest = max((len(_bytes(line)) for line in logs), default=0)
    if longest > MAX_LOG_LINE_BYTES:
        out.append(f"a line of {longest} bytes kept (at most {MAX_LOG_LINE_BYTES})")
    return out


def _against(kept: dict[str, Any], lines: list[str], settled: bool) -> list[str]:
    """What is wrong with ``kept`` as the log of a run that wrote ``lines`` (empty: nothing)."""
    logs, dropped = kept["logs"], kept["logs_dropped"]
    for i, line in enumerate(logs):
        if i < len(lines) and _explains(line, lines[i]):
            continue
        if any(_explains(line, w) for w in lines):
            return [f"line {i + 1} {line[:40]!r} out of order (or kept twice)"]
        return [f"line {i + 1} {line[:40]!r} was not written by that attempt"]
    if dropped and len(logs) < MAX_LOG_LINES:
        return [f"{dropped} line(s) counted dropped with only {len(logs)} kept "
                f"(lines are dropped only beyond {MAX_LOG_LINES})"]
    if len(logs) + dropped > len(lines):
        return [f"{len(logs)} kept + {dropped} dropped, but {len(lines)} written"]
    if settled and len(logs) + dropped < len(lines):
        return [f"settled ({kept['outcome']}) with {len(lines) - len(logs) - dropped} of its "
                f"{len(lines)} line(s) neither kept nor counted in logs_dropped"]
    return []


def _explains(kept: str, written: str) -> bool:
    """Whether ``kept`` is ``written`` as the bounds allow: whole, or (a line over the cap)
    its first bytes followed by ``...``."""
    if kept == written:
        return True
    raw = _bytes(written)
    return len(raw) > MAX_LOG_LINE_BYTES and kept.endswith(CUT_MARK) \
        and raw.startswith(_bytes(kept[:-len(CUT_MARK)]))


def _bytes(line: str) -> bytes:
    return line.encode("utf-8", "replace")
