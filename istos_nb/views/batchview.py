"""The dashboard's Batches tab: the batches a queue is home to, and one batch's members.

Pure HTML builders over the frames :meth:`LiveQueue.batches` and
:meth:`LiveQueue.batch_members` return, tested without a kernel. DOM classes:
``istos-batches`` (one row per batch: state, counts, each callback's state) and
``istos-batch-members`` (one row per member: queue, job id, state).
"""

from __future__ import annotations

from html import escape as esc
from typing import Any

import pandas as pd

from . import livetables as lt

KINDS = ("on_success", "on_complete", "on_death")


def batch_state(row: dict[str, Any]) -> str:
    """``open`` (members may still join), ``closed`` (waiting for members) or ``finished``."""
    if not row.get("closed"):
        return "open"
    return "closed" if lt.absent(row.get("finished_at")) else "finished"


def callback_text(callbacks: Any, kind: str, now: pd.Timestamp) -> str:
    """One callback's state: "-" (none), "waits (q)" or "fired 3 s ago (q)"."""
    cb = (callbacks or {}).get(kind) if isinstance(callbacks, dict) else None
    if not cb:
        return "-"
    fired = cb.get("fired_at")
    when = "waits" if fired is None else f"fired {lt.age(fired, now)} ago"
    return f"{when} ({cb.get('queue')})"


def batches_html(frame: pd.DataFrame, now: pd.Timestamp, total: int | None = None) -> str:
    """The batches table: id, description, state, counts, and each callback's state."""
    rows = []
    for r in frame.to_dict("records"):
        cells = [r["batch_id"], r.get("description") or "", batch_state(r),
                 *(int(r[k]) for k in ("total", "pending", "done", "dead", "cancelled")),
                 *(callback_text(r.get("callbacks"), k, now) for k in KINDS),
                 lt.age(r.get("created_at"), now) + " ago"]
        rows.append([f"<td>{esc(str(c))}</td>" for c in cells])
    shown = len(rows)
    note = f"{shown} batch(es)" + (f" of {total:,}" if total is not None and total > shown
                                   else "") + " this queue is home to, open ones first"
    return lt.html_table(["batch", "description", "state", "total", "pending", "done", "dead",
                          "cancelled", *KINDS, "created"], rows, note, "istos-batches")


def members_html(frame: pd.DataFrame, batch_id: str, more: bool = False) -> str:
    """One batch's members (as its home counted them): queue, job id, state."""
    rows = [[f"<td>{esc(str(r['queue']))}</td>", f"<td><code>{esc(str(r['job_id']))}</code>"
             "</td>", f"<td>{esc(str(r['state']))}</td>"] for r in frame.to_dict("records")]
    counts = frame["state"].value_counts().to_dict() if len(frame) else {}
    note = (f"batch {batch_id}: {len(rows)} member(s)" + (" shown (more)" if more else "")
            + (": " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) if counts
               else ""))
    return lt.html_table(["queue", "job id", "state"], rows, note, "istos-batch-members")
