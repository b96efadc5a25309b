"""The words the simulator dashboard uses, in one place, so its status line, Jobs tab and
invariants tab say the same thing.

Two vocabularies meet in a simulation run and both are shown:

- a job's **state** as the owner last recorded it (``done``, ``dead``, or unfinished:
  ``ready``/``delayed``/``leased``), the ``state`` column of ``SimResult.jobs``;
- the **delivery check** (Jepsen's total-queue counts, ``SimResult.counts``), which looks at the
  worker's side instead: did the handler run to completion for each accepted job?

They differ on purpose: a dead-lettered job whose handler finished once (its ack lost, then
every retry failed) is ``dead`` by state and ``ok`` by the check. :data:`CHECK_LEGEND` says what
each check word means, one line each.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape as _esc
from typing import Any

import pandas as pd

from istos_nb.sim.result import SimResult

from .run_report import applies

__all__ = ["CHECK_LEGEND", "check_html", "invariants_frame", "jobs_view", "status_text"]

CHECK_LEGEND: tuple[tuple[str, str], ...] = (
    ("ok", "accepted, and the handler ran to completion at least once"),
    ("lost", "accepted, never completed, and no owner holds it any more (a broken promise)"),
    ("duplicated", "completed more than once, e.g. redelivered after a lost ack; allowed by "
                   "at-least-once, and also counted as ok"),
    ("pending", "accepted, never completed, still held by the owner: dead-lettered, or not "
                "run yet when the run ended"),
)
_UNFINISHED = ("ready", "delayed", "leased")
HOLDS, VIOLATED, NOT_APPLIED = "✔ holds", "✘ violated", "– n/a"


def _verdict(effects: int, held: bool) -> str:
    if effects > 1:
        return "ok, duplicated"
    if effects == 1:
        return "ok"
    return "pending" if held else "lost"


def jobs_view(result: SimResult) -> pd.DataFrame:
    """The Jobs tab: ``SimResult.jobs`` with a ``check`` column (the delivery check per job)
    after ``state``; dead and lost jobs first, then unfinished (stuck) ones, then duplicated,
    then the rest, each group in first-seen order."""
    jobs = result.jobs
    check = [_verdict(int(n), j in result.held) for j, n in zip(jobs["job_id"], jobs["effects"])]
    view = jobs.assign(check=check)
    rank = [0 if s == "dead" or c == "lost" else 1 if s in _UNFINISHED else
            2 if "duplicated" in c else 3 for s, c in zip(view["state"], view["check"])]
    order = sorted(range(len(view)), key=rank.__getitem__)
    cols = ["job_id", "state", "check"] + [c for c in view.columns
                                           if c not in ("job_id", "state", "check")]
    return view.iloc[order][cols].reset_index(drop=True)


def _states(result: SimResult) -> dict[str, int]:
    counts = result.jobs["state"].value_counts()
    return {"done": int(counts.get("done", 0)), "dead": int(counts.get("dead", 0)),
            "unfinished": int(sum(counts.get(s, 0) for s in _UNFINISHED))}


def _check_counts(result: SimResult) -> dict[str, int]:
    return {word: int(result.counts[word]) for word, _ in CHECK_LEGEND}


def status_text(result: SimResult, params: Mapping[str, Any], report: pd.DataFrame) -> str:
    """``run finished: N jobs enqueued, k/n invariants hold · job states at t=T: ... ·
    delivery check: ...`` (plain text). "done" appears only as a job state."""
    states = ", ".join(f"{n} {s}" for s, n in _states(result).items())
    checks = ", ".join(f"{w} {n}" for w, n in _check_counts(result).items())
    return (f"run finished: {params['jobs']} jobs enqueued, {int(report['ok'].sum())}/"
            f"{len(report)} invariants hold · job states at t={result.virtual_s:.0f} s: "
            f"{states} · delivery check: {checks} · "
            f"{result.virtual_s:.0f} virtual s in {result.wall_s:.2f} wall s")


def jobs_intro(result: SimResult) -> str:
    """HTML line above the Jobs table: the state counts and the sort order."""
    states = ", ".join(f"{n} {s}" for s, n in _states(result).items())
    return (f"<p><b>{_esc(states)}</b>. Dead, lost and unfinished jobs are listed first; "
            "<i>check</i> is the delivery check (see the invariants tab).</p>")


def check_html(result: SimResult) -> str:
    """HTML legend of the delivery check: each word, its count in this run, what it means."""
    rows = "".join(f"<tr><td><b>{_esc(w)}</b></td><td>{n}</td><td style='text-align:left'>"
                   f"{_esc(meaning)}</td></tr>"
                   for (w, meaning), n in zip(CHECK_LEGEND, _check_counts(result).values()))
    return ("<p><b>Delivery check</b> (the worker's side: did each accepted job's handler "
            "run to completion?)</p><table class='istos-legend'><thead><tr><th>word</th>"
            f"<th>jobs</th><th style='text-align:left'>meaning</th></tr></thead>{rows}</table>"
            "<p><b>Invariants</b> (replayed from the owner's events)</p>")


def invariants_frame(report: pd.DataFrame, result: SimResult | None = None) -> pd.DataFrame:
    """The invariant report with ``ok`` spelled as ``holds`` / ``violated``, or (given the
    run) ``n/a`` with the reason for a check that had nothing to check in it, as in
    ``make demo``'s report (:func:`istos_nb.views.run_report.applies`)."""
    spelled = []
    for row in report.itertuples():
        applicable, why = (True, "") if result is None else \
            applies(result, row.invariant, row.detail)
        if row.ok and not applicable:
            spelled.append(f"{NOT_APPLIED}: {why}")
        else:
            spelled.append(HOLDS if row.ok else VIOLATED)
    return report.assign(ok=spelled).rename(columns={"ok": "holds"})
