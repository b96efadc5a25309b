"""How ``istos`` prints: plain-text tables for people, JSON-safe values for ``--json``.

Instants are shown in the local time zone (time only when today) next to their age; payloads
as one compact JSON line cut at :data:`PAYLOAD_CHARS`. Pure functions of owner replies.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from typing import Any

from ..protocol import latest_traceback
from .operator import decode_body
from .pause_view import pause_lines

PAYLOAD_CHARS = 60


def jsonable(value: Any) -> Any:
    """``value`` with job bodies decoded (``body`` -> ``data``) and other bytes as hex."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "body" and isinstance(v, bytes):
                out["data"] = jsonable(decode_body(v))
            else:
                out[str(k)] = jsonable(v)
        return out
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


def duration(seconds: float) -> str:
    s = abs(seconds)
    if s < 60:
        return f"{s:.1f} s"
    if s < 3600:
        return f"{s / 60:.0f} min"
    if s < 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def when(t: float | None, now: float) -> str:
    """``"14:03:07 (3 min ago)"`` / ``"in 2.0 s"``; empty for None."""
    if t is None:
        return ""
    local = dt.datetime.fromtimestamp(t).astimezone()
    today = dt.datetime.fromtimestamp(now).astimezone().date()
    stamp = local.strftime("%H:%M:%S" if local.date() == today else "%Y-%m-%d %H:%M:%S")
    rel = f"{duration(now - t)} ago" if now >= t else f"in {duration(t - now)}"
    return f"{stamp} ({rel})"


def compact(data: Any, limit: int = PAYLOAD_CHARS) -> str:
    text = json.dumps(jsonable(data), separators=(",", ":"), ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def cut(text: str, limit: int) -> str:
    """One line of ``text``, at most ``limit`` characters."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[("" if c is None else str(c)) for c in r] for r in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(header)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(header, widths)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


def page_note(shown: int, offset: int, total: int | None, what: str) -> str:
    if shown == 0:
        return f"no {what}" + (f" (of {total:,})" if total else "")
    first, last = offset + 1, offset + shown
    of = f"{total:,}" if total is not None else f"more than {last:,}"
    return f"{first:,}–{last:,} of {of} {what}"


def stats_text(s: dict[str, Any]) -> str:
    counts = s.get("counts") or {}
    totals = s.get("totals") or {}
    policy = s.get("policy") or {}
    oldest = s.get("oldest_ready_age_s")
    lines = [f"queue {s.get('queue')} on {s.get('node')}"
             + (" · PAUSED" if s.get("paused") else "") + (" · admin" if s.get("admin") else ""),
             "  jobs    " + "  ".join(f"{k} {v:,}" for k, v in counts.items()),
             f"  rates   enqueued {s.get('enqueue_rate', 0):.1f}/s  acked "
             f"{s.get('ack_rate', 0):.1f}/s  oldest ready "
             + ("-" if oldest is None else duration(float(oldest))),
             "  totals  " + "  ".join(f"{k} {v:,}" for k, v in totals.items())]
    lines.extend(pause_lines(s))
    lines.extend(latency_lines(s))
    if policy:
        lines.append(f"  policy  lease {policy.get('lease_s')} s  attempts "
                     f"{policy.get('max_attempts')}  backoff {policy.get('retry_backoff_s')}"
                     f"–{policy.get('retry_backoff_max_s')} s ±{policy.get('retry_jitter')}"
                     f"  keep results {policy.get('keep_results')}")
    groups = s.get("groups")
    if groups:
        busiest = "  ".join(f"{g.get('group')} {g.get('ready', 0):,}/{g.get('leased', 0):,}"
                            for g in (groups.get("busiest") or [])[:5])
        lines.append(f"  groups  {groups.get('count', 0):,} (ready/leased: {busiest or '-'})"
                     f"  cap {groups.get('concurrency') or '-'}  held back "
                     f"{groups.get('held_back', 0):,}")
    limit = s.get("rate_limit")
    if limit:
        lines.append(f"  limit   {limit.get('n')} claims per {limit.get('per_s'):g} s  tokens "
                     f"{limit.get('tokens')}  throttled {limit.get('throttled', 0):,}")
    return "\n".join(lines)


def latency_lines(s: dict[str, Any]) -> list[str]:
    """``wait`` and ``run`` percentiles over the last minute, when the owner sends them."""
    out = []
    for name in ("wait", "run"):
        p = s.get(f"{name}_s")
        if isinstance(p, dict) and p.get("n"):
            out.append(f"  {name:<7} p50 {_short(p['p50'])}  p95 {_short(p['p95'])}  "
                       f"p99 {_short(p['p99'])}  (last minute, {p['n']:,} jobs)")
    return out


def _short(seconds: float) -> str:
    """A latency: milliseconds under a second, else :func:`duration`."""
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else duration(seconds)


def jobs_text(rows: list[dict[str, Any]], total: int | None, offset: int, now: float) -> str:
    # "slot": the wire's ``worker`` field holds the slot id (node:function#i), glossary "slot"
    body = table(["job", "state", "enqueued", "attempts", "prio", "slot", "last error",
                  "payload"],
                 [[r["job_id"], r["state"], when(r.get("enqueued_at"), now), r.get("attempts"),
                   r.get("priority"), r.get("worker"), cut(r.get("last_error") or "", 40),
                   compact(decode_body(r.get("body")))]
                  for r in rows])
    return f"{page_note(len(rows), offset, total, 'jobs')}\n{body}" if rows else \
        page_note(0, offset, total, "jobs")


def why_text(job_id: str, why: dict[str, Any]) -> str:
    now = float(why.get("now") or 0.0)
    lines = [f"{job_id}: {why.get('state')}", f"  {why.get('reason')}"]
    until = why.get("until")
    if until is not None and now:
        lines.append(f"  until {when(float(until), now)}")
    for key, label in (("attempts", "attempts"), ("worker", "slot"), ("ahead", "ahead"),
                       ("last_error", "last error")):  # the wire's ``worker``: a slot id
        if why.get(key) not in (None, ""):
            lines.append(f"  {label}: {why[key]}")
    start_by = (why.get("job") or {}).get("start_by")
    if isinstance(start_by, (int, float)) and now:
        lines.append(f"  start deadline {when(float(start_by), now)}")
    lines += lifecycle_lines(why, now)
    if why.get("state") == "done":
        size = int(why.get("result_size") or 0)
        shown = why.get("result")
        lines.append("  result: " + (compact(decode_body(shown), 200) if shown is not None
                                     else f"({size:,} bytes, too big to show)" if size
                                     else "none"))
    lines.extend(workflow_lines(why.get("workflow")))
    lines.extend(waits_for_lines(why.get("waits_for")))
    tb = latest_traceback(history_of(why))
    if tb:
        lines.append("  traceback of the last failed attempt:")
        lines.extend("    " + line for line in tb.rstrip("\n").split("\n"))
    lines += logs_text(why)
    return "\n".join(lines)


def lifecycle_lines(why: dict[str, Any], now: float) -> list[str]:
    """A ``why`` reply's unique key, debounce burst and edits (docs/job-lifecycle.md)."""
    out = []
    if why.get("unique_key") is not None:
        out.append(f"  unique key: {why['unique_key']} ({why.get('unique') or 'active'})")
    if why.get("debounce_key") is not None:
        first = why.get("debounce_first_at")
        since = f", burst began {when(float(first), now)}" if first is not None and now else ""
        out.append(f"  debounce key: {why['debounce_key']}{since}")
    if why.get("edits"):
        at = why.get("edited_at")
        last = f", last {when(float(at), now)}" if at is not None and now else ""
        out.append(f"  edited {why['edits']} time(s) while waiting{last}")
    return out


def waits_for_lines(waits: Any) -> list[str]:
    """A child's parents (``after=``) as ``why`` reports them, one line each."""
    if not isinstance(waits, dict):
        return []
    head = (f"  parents (on_parent_failure={waits.get('on_parent_failure')}, "
            f"{waits.get('pending')} pending"
            + (", needs an operator" if waits.get("needs_operator") else "") + "):")
    rows = [[p.get("queue"), p.get("job_id"), p.get("state")]
            for p in waits.get("parents") or [] if isinstance(p, dict)]
    return [head] + ["    " + line for line in table(["queue", "job", "state"],
                                                        rows).split("\n")[1:]]


def workflow_lines(flow: Any) -> list[str]:
    """A workflow entry of ``why`` as one line per job: ``step 1  q2  ab12.1  leased  <-``."""
    if not isinstance(flow, dict):
        return []
    kind = flow.get("kind")
    here = flow.get("step", flow.get("index"))
    head = f"  workflow: {kind} {flow.get('id')}"
    if kind == "chord":
        head += f" ({flow.get('size')} members)"
        if flow.get("batch"):  # a chord with ends: its batch says how it ended
            head += f"; its ends: istos batch {flow.get('batch')}"
        stalled = flow.get("stalled")
        if isinstance(stalled, dict) and stalled.get("note"):
            head += f"\n  stalled: {stalled['note']}"
    rows = [[("step " if kind == "chain" else "member ") + str(j.get("index"))
             if j.get("index") != "callback" else "callback", j.get("queue"), j.get("job_id"),
             j.get("state") or "?", "<- this job" if j.get("index") == here else ""]
            for j in flow.get("jobs") or []]
    return [head] + ["    " + line for line in table(["", "queue", "job", "state", ""],
                                                        rows).split("\n")[1:]]


def history_of(why: dict[str, Any]) -> list[dict[str, Any]]:
    """A ``why`` reply's attempt history (a dead job's travels in its dead letter)."""
    dead = why.get("dead_letter")
    source = dead if isinstance(dead, dict) else why.get("job") or {}
    history = source.get("history") if isinstance(source, dict) else None
    return [a for a in history or [] if isinstance(a, dict)]

def logs_text(why: dict[str, Any], last: int = 20) -> list[str]:
    """The ``ctx.log()`` lines of the job's attempts (a dead job's come in its dead letter),
    the last ``last`` of each attempt."""
    out = []
    for a in history_of(why):
        logs = a.get("logs") or []
        omitted = a.get("logs_omitted") or 0
        if not logs and not a.get("logs_dropped") and not omitted:
            continue
        more = len(logs) - last
        out.append(f"  log of attempt {a.get('attempt')}"
                   + (f" ({a['logs_dropped']} line(s) beyond the limit dropped)"
                      if a.get("logs_dropped") else "")
                   + (f" ({omitted} older line(s) not in this reply: app.job_logs reads them)"
                      if omitted else "")
                   + (f" (last {last} of {len(logs)})" if more > 0 else "") + ":")
        out += [f"    {cut(line, 200)}" for line in logs[-last:]]
    return out


def dead_text(dead: list[dict[str, Any]], now: float) -> str:
    if not dead:
        return "no dead letters"
    return f"{len(dead):,} dead letter(s)\n" + table(
        ["job", "died", "attempts", "last error", "payload"],
        [[d["job_id"], when(d.get("finished_at"), now), d.get("attempts"),
          cut(d.get("last_error") or "", 50), compact(decode_body(d.get("body")))]
         for d in dead])


def leases_text(leases: list[dict[str, Any]], now: float) -> str:
    if not leases:
        return "no live leases"
    return table(["job", "slot", "attempt", "lease ends"],  # the wire's ``worker``: a slot id
                 [[x["job_id"], x.get("worker"), x.get("attempt"), when(x.get("deadline"), now)]
                  for x in leases])


def event_line(e: dict[str, Any]) -> str:
    t = dt.datetime.fromtimestamp(float(e.get("t", 0.0))).astimezone()
    parts = [t.strftime("%H:%M:%S.%f")[:-3], str(e.get("kind")), str(e.get("job_id") or "-")]
    if e.get("attempt"):
        parts.append(f"attempt {e['attempt']}")
    if e.get("worker"):
        parts.append(str(e["worker"]))
    detail = e.get("detail") or {}
    if isinstance(detail, dict) and detail.get("change"):  # a batch or chord event
        parts.append(str(detail["change"]))
    if isinstance(detail, dict) and detail.get("error"):
        parts.append(f"error: {cut(str(detail['error']), 60)}")
    return "  ".join(parts)


def series_text(rows: list[dict[str, Any]], total: int, now: float) -> str:
    """The newest series rows as a table (local times; wait/run p95)."""
    if not rows:
        return "no series yet (the owner has seen no job events)"

    def p95(v: Any) -> str:
        return "" if v is None else duration(float(v))

    body = table(["time", "ready", "delayed", "leased", "dead", "enq", "claimed", "acked",
                  "nacked", "wait p95", "run p95"],
                 [[dt.datetime.fromtimestamp(float(r["t"])).astimezone().strftime("%H:%M:%S"),
                   r.get("ready"), r.get("delayed"), r.get("leased"), r.get("dead"),
                   r.get("enqueued"), r.get("claimed"), r.get("acked"), r.get("nacked"),
                   p95(r.get("wait_p95_s")), p95(r.get("run_p95_s"))] for r in rows])
    return f"last {len(rows):,} of {total:,} buckets\n{body}"


def marker_line(m: dict[str, Any]) -> str:
    """A follower's marker (owner_lost, owner_back, gap) as a line of its own."""
    t = dt.datetime.fromtimestamp(float(m.get("t", 0.0))).astimezone()
    return f"{t.strftime('%H:%M:%S.%f')[:-3]}  *** {str(m.get('kind')).upper()}: " \
        f"{m.get('message')}"
