"""HTML for the live dashboard's tables: local times and ages, one-line payloads, job detail.

Pure functions of frames and dicts (no widgets), so they are tested without a kernel. Times are
shown in the viewer's local time zone (``HH:MM:SS`` today, a date otherwise) next to their age
("3 min"); payloads as one compact JSON line cut at :data:`PAYLOAD_CHARS`, the full value in the
cell's ``title`` (hover) and in the job detail. DOM classes: ``istos-table`` on every table's
container, ``istos-job-card`` on the detail, ``istos-history`` on its attempts table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from html import escape as esc
from typing import Any

import pandas as pd

from istos.ops.pause_view import pause_phrase

from ..live.reply_tables import ago

PAYLOAD_CHARS = 80
CSS = ("<style>.istos-table table{border-collapse:collapse;font-size:12px}"
       ".istos-table th,.istos-table td{padding:2px 8px;text-align:left;white-space:nowrap}"
       ".istos-table tr:nth-child(even){background:rgba(127,127,127,.08)}"
       ".istos-table td.istos-payload{font-family:monospace;max-width:40em;overflow:hidden;"
       "text-overflow:ellipsis}</style>")


def absent(value: Any) -> bool:
    """Whether a table cell holds nothing (None, NaT or NaN)."""
    return value is None or value is pd.NaT or (isinstance(value, float) and math.isnan(value))


def _ts(value: Any) -> pd.Timestamp:
    if isinstance(value, (int, float)):  # epoch seconds (a frame from the simulator side)
        return pd.Timestamp(float(value), unit="s", tz="UTC")
    ts = pd.Timestamp(value)
    return ts if ts.tzinfo is not None else ts.tz_localize("UTC")


def local_time(ts: Any, now: pd.Timestamp) -> str:
    """``ts`` (a UTC Timestamp) in the local zone: the time today, else date and time."""
    if absent(ts):
        return ""
    local = _ts(ts).floor("us").to_pydatetime().astimezone()
    today = now.floor("us").to_pydatetime().astimezone().date()
    return local.strftime("%H:%M:%S" if local.date() == today else "%Y-%m-%d %H:%M:%S")


def age(ts: Any, now: pd.Timestamp) -> str:
    """How long ago ``ts`` was ("3 min"), or "in 2.0 s" for a future instant."""
    if absent(ts):
        return ""
    seconds = (now - _ts(ts)).total_seconds()
    return ago(seconds) if seconds >= 0 else f"in {ago(seconds)}"


def compact(data: Any) -> str:
    """One line of JSON (bytes shown as their repr), for any payload."""
    if isinstance(data, bytes):
        return repr(data)
    try:
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(data)


def _cell(text: str, cls: str = "", limit: int | None = None) -> str:
    shown = text if limit is None or len(text) <= limit else text[:limit - 1] + "…"
    title = f' title="{esc(text)}"' if shown != text else ""
    klass = f' class="{cls}"' if cls else ""
    return f"<td{klass}{title}>{esc(shown)}</td>"


def html_table(header: Sequence[str], rows: Sequence[Sequence[str]], note: str = "",
               cls: str = "") -> str:
    """Rows of ready-made ``<td>`` cells under ``header``, with a note line above."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(f"<tr>{''.join(r)}</tr>" for r in rows)
    klass = f' class="{cls}"' if cls else ""
    return (f"{CSS}<p>{esc(note)}</p><div class=\"istos-scroll\" "
            "style=\"max-height:420px;max-width:100%;overflow:auto\">"
            f"<table{klass}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>")


def page_note(shown: int, total: int | None, what: str, offset: int = 0) -> str:
    """ "1–200 of 5,123 jobs", "201–400 of 5,123 jobs" from ``offset`` 200 (or "no jobs", or
    "1–200 of more than 200 jobs" when the total is unknown)."""
    if shown == 0:
        return f"no {what}" if not total else f"0 of {total:,} {what}"
    first, last = offset + 1, offset + shown
    if total is None:
        return f"{first:,}–{last:,} of more than {last:,} {what}"
    return f"{first:,}–{last:,} of {total:,} {what}"


def _text(value: Any) -> str:
    return "" if absent(value) else str(value)


_Col = tuple[str, Callable[[Any, pd.Timestamp], str]]


def _rows(df: pd.DataFrame, now: pd.Timestamp, cols: Sequence[_Col]) -> list[list[str]]:
    records = df.to_dict("records")
    return [[fmt(r, now) for _, fmt in cols] for r in records]


def _payload(r: dict[str, Any], _now: pd.Timestamp) -> str:
    return _cell(compact(r.get("data")), "istos-payload", PAYLOAD_CHARS)


NO_TIME = "–"
_SETTLED = ("dead", "done", "finished", "cancelled", "expired")


def _due(r: dict[str, Any], now: pd.Timestamp) -> str:
    """When a leased job's lease ends, or a delayed job becomes ready ("in 2.0 s"), or since
    when a ready one is ("3 min"); a dead, done or cancelled job has neither (``–``)."""
    if r.get("state") in _SETTLED:
        return NO_TIME
    deadline = r.get("deadline")
    return age(deadline if not absent(deadline) else r.get("ready_at"), now)


_JOB_COLS: tuple[_Col, ...] = (
    ("job", lambda r, n: _cell(_text(r.get("job_id")))),
    ("state", lambda r, n: _cell(_text(r.get("state")))),
    ("age", lambda r, n: _cell(age(r.get("enqueued_at"), n))),
    ("enqueued", lambda r, n: _cell(local_time(r.get("enqueued_at"), n))),
    ("attempts", lambda r, n: _cell(_text(r.get("attempts")))),
    ("priority", lambda r, n: _cell(_text(r.get("priority")))),
    ("slot", lambda r, n: _cell(_text(r.get("worker")))),  # the wire's worker: a slot id
    ("ready / lease ends", lambda r, n: _cell(_due(r, n))),
    ("last error", lambda r, n: _cell(_text(r.get("last_error")), limit=60)),
    ("payload", _payload),
)
_DEAD_COLS: tuple[_Col, ...] = (
    ("job", lambda r, n: _cell(_text(r.get("job_id")))),
    ("dead since", lambda r, n: _cell(age(r.get("finished_at"), n))),
    ("died", lambda r, n: _cell(local_time(r.get("finished_at"), n))),
    ("attempts", lambda r, n: _cell(_text(r.get("attempts")))),
    ("last error", lambda r, n: _cell(_text(r.get("last_error")), limit=60)),
    ("payload", _payload),
)
_ATTEMPT_COLS: tuple[_Col, ...] = (
    ("attempt", lambda r, n: _cell(_text(r.get("attempt")))),
    ("slot", lambda r, n: _cell(_text(r.get("worker")))),  # the wire's worker: a slot id
    ("claimed", lambda r, n: _cell(local_time(r.get("claimed_at"), n))),
    ("took", lambda r, n: _cell("" if absent(r.get("finished_at")) else
                                ago((_ts(r.get("finished_at")) - _ts(r.get("claimed_at")))
                                    .total_seconds()))),
    ("outcome", lambda r, n: _cell(_text(r.get("outcome")))),
    ("error", lambda r, n: _cell(_text(r.get("error")), limit=60)),
    ("backoff after", lambda r, n: _cell("" if absent(r.get("backoff")) else
                                         ago(pd.Timedelta(r.get("backoff")).total_seconds()))),
)


def jobs_html(df: pd.DataFrame, now: pd.Timestamp, total: int | None, what: str = "jobs",
              offset: int = 0) -> str:
    """The Jobs tab: one page as given, "201–400 of 5,123 jobs" above (from ``offset``)."""
    return html_table([c for c, _ in _JOB_COLS], _rows(df, now, _JOB_COLS),
                      page_note(len(df), total, what, offset))


def dead_html(df: pd.DataFrame, now: pd.Timestamp) -> str:
    """The dead letters as one table (the attempt history is in the job detail)."""
    return html_table([c for c, _ in _DEAD_COLS], _rows(df, now, _DEAD_COLS),
                      page_note(len(df), len(df), "dead letters"))


DEAD_HEADER = tuple(c for c, _ in _DEAD_COLS)


def dead_cells(r: dict[str, Any], now: pd.Timestamp) -> list[str]:
    """One dead letter's ``<td>`` cells, in :data:`DEAD_HEADER`'s order (the dashboard's rows
    with actions put each in a cell of their own)."""
    return [fmt(r, now) for _, fmt in _DEAD_COLS]


def detail_html(detail: dict[str, Any], now: pd.Timestamp) -> str:
    """One job: state and reason, its record, the full payload, its attempts as a table."""
    rec, why = detail.get("record") or {}, detail.get("why") or {}
    facts = [("state", _text(detail.get("state"))), ("why", _text(why.get("reason")))]
    for key in ("enqueued_at", "ready_at", "deadline", "finished_at", "expires_at"):
        if not absent(rec.get(key)):
            rel = age(rec[key], now)
            facts.append((key.removesuffix("_at"), f"{local_time(rec[key], now)} "
                          f"({rel if rel.startswith('in ') else rel + ' ago'})"))
    for key in ("priority", "attempts", "worker", "last_error"):
        if not absent(rec.get(key)):  # the wire's ``worker`` holds a slot id: shown as such
            facts.append(("slot" if key == "worker" else key.replace("_", " "), _text(rec[key])))
    dl = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in facts)
    payload = json.dumps(detail.get("data"), indent=2, ensure_ascii=False, default=str)
    attempts = detail.get("attempts")
    history = html_table([c for c, _ in _ATTEMPT_COLS],
                         _rows(attempts, now, _ATTEMPT_COLS) if attempts is not None else [],
                         f"{0 if attempts is None else len(attempts)} attempt(s)",
                         "istos-history")
    logs = detail.get("logs") or []  # ctx.log() lines, oldest first
    log_html = "" if not logs else (
        f"<p>log ({len(logs)} line(s))</p><pre>"
        + esc("\n".join(f"[{x.get('attempt')}] {x.get('line')}" for x in logs)) + "</pre>")
    return (f"{CSS}<div class=\"istos-job-card istos-table\"><h4>job {esc(detail['job_id'])}"
            f"</h4><table>{dl}</table><p>payload</p><pre>{esc(payload)}</pre>{history}"
            f"{log_html}</div>")


def oldest_first(jobs: pd.DataFrame) -> pd.DataFrame:
    """The page sorted by enqueue time (stable: the owner's order among equals)."""
    if "enqueued_at" not in jobs or jobs.empty:
        return jobs
    return jobs.sort_values("enqueued_at", kind="stable", ignore_index=True)


def stats_text(stats: Mapping[str, Any]) -> str:
    """One line: queue and node, job counts by state, rates, oldest ready age, paused."""
    parts = [f"queue {stats.get('queue', '?')} on {stats.get('node', '?')}"]
    parts += [f"{state} {n}" for state, n in (stats.get("counts") or {}).items()]
    for key, label in (("enqueue_rate", "enqueued"), ("ack_rate", "acked")):
        if stats.get(key) is not None:
            parts.append(f"{label} {float(stats[key]):.1f}/s")
    if stats.get("oldest_ready_age_s") is not None:
        parts.append(f"oldest ready {ago(float(stats['oldest_ready_age_s']))}")
    if stats.get("paused"):
        phrase = pause_phrase(stats.get("pause"))
        parts.append("PAUSED" + (f" {phrase}" if phrase else ""))
    paused_groups = stats.get("paused_groups")
    if isinstance(paused_groups, dict) and paused_groups.get("count"):
        parts.append(f"{paused_groups.get('count')} group(s) paused")
    if stats.get("admin"):
        parts.append("admin")
    return " · ".join(parts)
