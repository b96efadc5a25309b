"""Replies that carry a job's history fit their frame, whatever the job's attempts logged.

A history entry may hold up to ``MAX_LOG_LINES`` ``ctx.log()`` lines of up to
``MAX_LOG_LINE_BYTES`` each (~100 KiB), and a history keeps 20 entries: with a body at its
limit that is about three frames. So the replies that show a history (``why`` and ``dead``)
show the logs of as many attempts as a byte budget allows, newest attempt first and, within the
attempt that does not fit whole, its newest lines; every entry that lost lines says how many
(``logs_omitted``), and the ``logs`` op reads them all, a page of attempts at a time
(:func:`log_pages`). Everything else in a history is bounded by the protocol's limits, so the
rest of the item always fits one frame (``tests/test_reply_fit.py`` builds the largest one).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ... import protocol
from ...core.records import Attempt


def line_cost(line: str) -> int:
    """The encoded size of one log line (msgpack: at most 3 bytes of header for these)."""
    return len(line.encode("utf-8", "replace")) + 3


def fit_logs(history: list[dict[str, Any]], budget: int) -> int:
    """Cut the ``logs`` of ``history`` entries (as :meth:`Attempt.to_dict` makes them, changed
    in place) to at most ``budget`` encoded bytes in all: the newest attempts keep theirs whole,
    the first one that does not fit keeps its newest lines. Each entry that lost lines gets
    ``logs_omitted`` (how many); returns the lines omitted in all."""
    left, omitted = max(0, budget), 0
    for entry in reversed(history):
        lines = entry.get("logs")
        if not lines:
            continue
        costs = [line_cost(line) for line in lines]
        total = sum(costs)
        if total <= left:
            left -= total
            continue
        kept = 0
        while kept < len(lines) and costs[len(lines) - 1 - kept] <= left:
            left -= costs[len(lines) - 1 - kept]
            kept += 1
        left = 0  # older attempts get nothing: the reply shows a contiguous newest part
        entry["logs"] = lines[len(lines) - kept:] if kept else []
        # (added to: a reply fitted again after it grew keeps counting what it left out)
        entry["logs_omitted"] = entry.get("logs_omitted", 0) + len(lines) - kept
        omitted += len(lines) - kept
    return omitted


def logs_budget(item: dict[str, Any], history: list[dict[str, Any]], room: int) -> int:
    """Bytes ``history``'s logs may take so that ``item`` (which holds ``history``) stays within
    ``room`` encoded bytes, and within :data:`protocol.MAX_LOGS_SHOWN`."""
    saved = [entry.pop("logs", None) for entry in history]
    try:
        base = protocol.encoded_size(item)
    finally:
        for entry, lines in zip(history, saved):
            if lines is not None:
                entry["logs"] = lines
    # (an empty list and the ``logs_omitted`` count an entry may gain: a few bytes each)
    return min(protocol.MAX_LOGS_SHOWN, room - base - 24 * len(history))


def fit_item(item: dict[str, Any], history: list[dict[str, Any]],
             room: int = protocol.PAGE_BUDGET) -> dict[str, Any]:
    """``item`` with ``history``'s logs cut to fit ``room`` bytes; ``logs_omitted`` is set on
    ``item`` when lines were left out (read them with the ``logs`` op)."""
    if any(entry.get("logs") for entry in history):
        omitted = fit_logs(history, logs_budget(item, history, room))
        if omitted:
            item["logs_omitted"] = item.get("logs_omitted", 0) + omitted
    return item


def fit_why(why: dict[str, Any], room: int = protocol.PAGE_BUDGET) -> dict[str, Any]:
    """A ``why`` answer within ``room`` bytes: its history's logs cut first (:func:`fit_item`);
    if it is still larger (a body at its limit with everything else at its limit too, and a
    workflow description), the body is left out (``body`` nil, ``body_size`` its bytes: the
    ``jobs`` and ``dead`` ops show it). May be applied again after the answer grew."""
    holder = why.get("dead_letter") or why.get("job") or {}
    history = holder.get("history") or []
    fit_item(why, history, room)
    if protocol.encoded_size(why) > room and isinstance(holder.get("body"), bytes):
        holder["body_size"] = len(holder["body"])
        holder["body"] = None
    return why


def log_entry(attempt: Attempt) -> dict[str, Any]:
    return {"attempt": attempt.attempt, "logs": list(attempt.logs or ()),
            "logs_dropped": attempt.logs_dropped or 0}


def log_pages(history: Iterable[Attempt], after: int,
              budget: int = protocol.PAGE_BUDGET) -> tuple[list[dict[str, Any]], bool]:
    """The ``logs`` op's page: the attempts numbered above ``after`` that wrote lines, oldest
    first, whole, while they fit ``budget`` bytes (one attempt's lines always fit alone)."""
    written = (a for a in history if a.attempt > after and a.logs)
    return protocol.page(written, log_entry, protocol.MAX_PAGE, budget)
