"""The operator's views on the dashboard: the Workers tab, the Latency tab (wait and
run histograms), a job's traceback, result and workflow in its detail, the overview page of
every queue, and the page ``istos dashboard`` serves (one queue, or the overview; ``?queue=``
and ``?job=`` in its URL).

Pure HTML builders, tested without a kernel; the page itself is
:func:`istos_nb.views.dashboard_page.page`.
DOM classes: ``istos-workers``, ``istos-latency``, ``istos-traceback``, ``istos-result``,
``istos-workflow`` (one ``istos-step`` per job, ``istos-step-here`` on this one),
``istos-overview`` (its rows link to ``?queue=NAME``).
"""

from __future__ import annotations

import json
import urllib.parse
from html import escape as esc
from typing import Any

import pandas as pd

from . import livetables as lt

_STATE_COLOURS = {"ready": "#4c78a8", "delayed": "#9ecae9", "leased": "#f58518",
                  "done": "#54a24b", "finished": "#54a24b", "dead": "#e45756",
                  "cancelled": "#bab0ac"}


def workers_html(df: pd.DataFrame, now: pd.Timestamp) -> str:
    rows = []
    for r in df.to_dict("records"):
        pre = r.get("prefetch")
        conf = "?" if lt.absent(r.get("concurrency")) else (
            f"{r['concurrency']} + {'auto' if pre == -1 else pre}"
            + (" · heartbeat" if r.get("heartbeat") is True else ""))
        held = ", ".join(r.get("held") or [])
        rows.append([f"<td>{esc(str(v))}</td>" for v in (
            r["worker"], "?" if lt.absent(r.get("slots")) else r["slots"], conf,
            f"{r['held_count']}" + (f" ({held})" if held else ""),
            f"{lt.age(r['last_seen'], now)} ago", f"{lt.age(r['first_seen'], now)} ago",
            r["claimed"], r["acked"], r["nacked"], r["expired"], r["released"])])
    note = f"{len(rows)} worker(s) seen in the last few lease periods"
    return lt.html_table(["worker", "slots", "concurrency + prefetch", "held", "last seen",
                          "first seen", "claimed", "acked", "nacked", "expired", "released"],
                         rows, note, "istos-workers")


def _bars(hist: dict[str, Any]) -> str:
    """A histogram as horizontal HTML bars, one per bucket that holds any sample."""
    counts = list(hist.get("counts") or [])
    per = [n - (counts[i - 1] if i else 0) for i, n in enumerate(counts)]
    top = max(per, default=0) or 1
    rows, lower = [], "0"
    for le, n in zip(hist.get("le") or [], per):
        label = f"{lower}–{le} s" if le != "+Inf" else f"> {lower} s"
        lower = str(le)
        if n:
            width = max(1, round(300 * n / top))
            rows.append(f"<tr><td>{esc(label)}</td><td><div style=\"background:#4c78a8;"
                        f"height:10px;width:{width}px\"></div></td><td>{n:,}</td></tr>")
    return "<table>" + "".join(rows) + "</table>" if rows else "<p>no samples yet</p>"


def latency_html(stats: dict[str, Any]) -> str:
    parts = []
    for name, title in (("wait", "wait (claimable until claimed)"),
                        ("run", "run (claimed until acked, nacked or expired)")):
        p = stats.get(f"{name}_s") or {}
        line = "last minute: no jobs" if not p.get("n") else (
            f"last minute, {p['n']:,} jobs: p50 {p['p50']:.3f} s · p95 {p['p95']:.3f} s · "
            f"p99 {p['p99']:.3f} s")
        hist = stats.get(f"{name}_hist") or {}
        parts.append(f"<h4>{esc(title)}</h4><p>{esc(line)}</p><p>since the owner started "
                     f"({hist.get('count', 0):,} jobs):</p>{_bars(hist)}")
    return f"{lt.CSS}<div class=\"istos-latency istos-table\">{''.join(parts)}</div>"


def workflow_html(flow: Any) -> str:
    if not isinstance(flow, dict) or not isinstance(flow.get("jobs"), pd.DataFrame):
        return ""
    here = flow.get("step", flow.get("index"))
    steps = []
    for j in flow["jobs"].to_dict("records"):
        state = j.get("state") or "?"
        mine = " istos-step-here" if j.get("index") == here else ""
        colour = _STATE_COLOURS.get(state, "#ddd")
        steps.append(f"<div class=\"istos-step{mine}\" style=\"display:inline-block;"
                     f"margin:2px;padding:4px 8px;border-radius:4px;border:2px solid {colour}"
                     f"{';font-weight:bold' if mine else ''}\">{esc(str(j.get('index')))}: "
                     f"{esc(str(j.get('queue')))}<br><code>{esc(str(j.get('job_id')))}</code>"
                     f"<br>{esc(state)}</div>")
    arrow = " → " if flow.get("kind") == "chain" else " "
    return (f"<div class=\"istos-workflow\"><p>workflow: {esc(str(flow.get('kind')))} "
            f"{esc(str(flow.get('id')))}</p>{arrow.join(steps)}</div>")


def detail_extras_html(detail: dict[str, Any]) -> str:
    """What a job's detail adds for the operator: workflow, kept result, last traceback."""
    why = detail.get("why") or {}
    out = [workflow_html(why.get("workflow"))]
    if why.get("state") == "done":
        size = int(why.get("result_size") or 0)
        shown = json.dumps(why.get("result"), indent=2, ensure_ascii=False, default=str) \
            if why.get("result") is not None or not size else f"({size:,} bytes: too big to show)"
        out.append(f"<p>result</p><pre class=\"istos-result\">{esc(shown)}</pre>")
    if why.get("traceback"):
        out.append("<p>traceback of the last failed attempt</p><pre class=\"istos-traceback\">"
                   f"{esc(str(why['traceback']))}</pre>")
    return "".join(out)


def overview_html(frame: pd.DataFrame) -> str:
    """Every queue, one row each; the queue's name opens its dashboard (``?queue=``)."""
    states = ("ready", "delayed", "leased", "done", "dead")
    rows = []
    for r in frame.to_dict("records"):
        link = "?" + urllib.parse.urlencode({"queue": r["queue"]})
        cells = [f"<td><a href=\"{esc(link)}\" target=\"_top\">{esc(r['queue'])}</a></td>",
                 f"<td>{esc(str(r.get('owner') or '(no answer)'))}</td>",
                 f"<td>{esc(str(r.get('role')))}</td>"]
        cells += [f"<td>{'' if lt.absent(r.get(s)) else int(r[s])}</td>" for s in states]
        cells += [f"<td>{'' if lt.absent(r.get(k)) else f'{float(r[k]):.1f}/s'}</td>"
                  for k in ("enqueue_rate", "ack_rate")]
        rows.append(cells)
    return lt.html_table(["queue", "owner", "role", *states, "enqueued", "acked"], rows,
                         f"{len(rows)} queue(s)", "istos-overview")
