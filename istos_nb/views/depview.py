"""The dashboard's Dependencies tab: the jobs of a queue that wait for parents.

Pure HTML builder over what the owner's read ops return: the page of ``waiting`` jobs
(:meth:`LiveQueue.jobs`) and each one's ``why`` (:meth:`LiveQueue.why`), whose ``waits_for``
holds each parent's outcome as reported, the ``on_parent_failure`` mode and whether the job
needs an operator. Tested without a kernel. DOM class: ``istos-deps`` (one row per waiting
job: job id, age, parents, mode, operator).
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape as esc
from typing import Any

import pandas as pd

from . import livetables as lt

DEP_ROWS = 50
"""Waiting jobs the tab shows (one ``why`` request each), oldest first."""


def parents_text(waits: Any) -> str:
    """Each parent as ``queue/job_id: outcome`` (outcome as reported so far), one a line."""
    parents = waits.get("parents") if isinstance(waits, Mapping) else None
    if not parents:
        return "-"
    return "\n".join(f"{p.get('queue')}/{p.get('job_id')}: {p.get('state')}" for p in parents)


def dep_cells(job_id: str, enqueued_at: Any, why: Mapping[str, Any] | None,
              now: pd.Timestamp) -> list[str]:
    """One waiting job's cells: id, age, parents, mode, operator. A job whose ``why`` says
    it waits no more (it was released between the listing and its ``why``) reads
    ``now <state>`` in its parents cell."""
    why = why or {}
    waits = why.get("waits_for")
    state = why.get("state")
    if state is not None and state != "waiting":
        parents, mode, operator = f"now {state}", "-", "-"
    else:
        mode = str(waits.get("on_parent_failure", "-")) if isinstance(waits, Mapping) else "-"
        needs = isinstance(waits, Mapping) and bool(waits.get("needs_operator"))
        parents, operator = parents_text(waits), "yes: a parent failed" if needs else "no"
    cells = [f"<td><code>{esc(str(job_id))}</code></td>",
             f"<td>{esc(lt.age(enqueued_at, now))} ago</td>",
             "<td>" + "<br>".join(esc(line) for line in parents.split("\n")) + "</td>",
             f"<td>{esc(mode)}</td>", f"<td>{esc(operator)}</td>"]
    return cells


def deps_html(jobs: pd.DataFrame, whys: Mapping[str, Mapping[str, Any] | None],
              now: pd.Timestamp, total: int | None = None) -> str:
    """The waiting jobs' table: ``jobs`` is the page of waiting jobs (job_id, enqueued_at),
    ``whys`` each one's ``why`` by job id (None: not read)."""
    rows = [dep_cells(r["job_id"], r.get("enqueued_at"), whys.get(r["job_id"]), now)
            for r in jobs.to_dict("records")]
    shown = len(rows)
    needing = sum(1 for w in whys.values() if isinstance(w, Mapping)
                  and isinstance(w.get("waits_for"), Mapping)
                  and w["waits_for"].get("needs_operator") and w.get("state") == "waiting")
    note = (f"{shown} waiting job(s)" + (f" of {total:,}" if total is not None and total > shown
                                          else "") + ", oldest first"
            + (f"; {needing} need(s) an operator" if needing else ""))
    return lt.html_table(["job id", "age", "parents (queue/job id: outcome)",
                          "on_parent_failure", "needs operator"], rows, note, "istos-deps")
