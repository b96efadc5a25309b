"""The batch invariants: each callback at most once (and exactly once when due by the end),
and no batch count lost across owner restarts and failovers.

Inputs are the workload's record of its batches (``sim/batch_workload.py``: id, home, members and
their queues, which adds were confirmed, when the batch was closed), the owners' events and
the headers the homes kept in storage at the end. The checker keeps its own model: a member's
outcome is the last of its ``acked`` / ``dead_lettered`` / ``cancelled`` events, except that a
member its home kept done (a ``batch`` event ``kept_done``: counted done, since its handler
succeeded, before an ack that came too late) is done, as ``done`` is final; a callback
"fired" when an owner emitted ``enqueued`` for ``{batch id}.{kind}``.

A condition that came true in the last :data:`SETTLE_S` seconds of the run is not required yet
(a report or a firing may still be retrying with backoff after a fault): such batches are
counted as unsettled in the detail, never as failures.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from .run_record import Finding, RunRecord, summary

SETTLE_S = 60.0  # above the engine's report and firing backoff cap (30 s) plus a timeout
ENDS = {"acked": "done", "dead_lettered": "dead", "cancelled": "cancelled"}
CALLBACKS_ONCE = "batch callbacks: at most once each, exactly once when due by the end"
COUNTS_KEPT = "no batch count lost across owner restarts and failovers"


def batch_findings(rec: RunRecord) -> list[Finding]:
    """The two batch invariants (see the module doc); "no batch in this run" when none."""
    if not rec.batches:
        return [Finding(CALLBACKS_ONCE, True, "no batch in this run"),
                Finding(COUNTS_KEPT, True, "no batch in this run")]
    model = _Model(rec)
    once: list[str] = []
    counts: list[str] = []
    unsettled = 0
    for row in rec.batches:
        bid = row["batch_id"]
        if bid is None:
            continue
        b = model.judge(row)
        unsettled += not b["settled"]
        once += _callback_problems(bid, b)
        if b["settled"]:
            counts += _count_problems(bid, b, rec.batch_headers.get(bid))
    n = sum(1 for r in rec.batches if r["batch_id"] is not None)
    tail = f"; {unsettled} unsettled in the last {SETTLE_S:g} s" if unsettled else ""
    return [Finding(CALLBACKS_ONCE, not once, (summary(once) if once else
                                               f"{n} batches ok") + tail),
            Finding(COUNTS_KEPT, not counts, (summary(counts) if counts else
                                              f"{n} batches ok") + tail)]


def _callback_problems(bid: str, b: dict[str, Any]) -> list[str]:
    """What breaks "at most once, exactly once when due" for one batch."""
    bad = [f"{bid}: {kind} enqueued {n} times" for kind, n in b["fired"].items() if n > 1]
    if b["settled"]:
        bad += [f"{bid}: {kind} due by t={b['due_at']:.1f} and never fired"
                for kind in b["due"] if not b["fired"].get(kind)]
    for kind in b["fired"]:
        if kind not in b["due"] and b["settled"]:
            bad.append(f"{bid}: {kind} fired though its condition never held "
                       f"({b['outcomes']})")
    return bad


def _count_problems(bid: str, b: dict[str, Any], header: dict[str, Any] | None) -> list[str]:
    if header is None:
        return [f"{bid}: its home kept no header"]
    out = b["outcomes"]
    bad = []
    added, confirmed = b["added"], b["confirmed"]
    if not confirmed <= header["total"] <= added:
        bad.append(f"{bid}: total {header['total']}, {confirmed} adds confirmed of {added}")
    for state in ("done", "dead", "cancelled"):
        if header[state] != out[state]:
            bad.append(f"{bid}: {state} {header[state]} at its home, {out[state]} by the "
                       "members' events")
    return bad


class _Model:
    """Members' outcomes and callbacks' firings, from the events."""

    def __init__(self, rec: RunRecord) -> None:
        self.end_t = rec.end_t
        self.fired: Counter[str] = Counter()
        self.last: dict[str, tuple[str, float]] = {}  # member job id -> (outcome, t)
        members = {j for r in rec.batches for j in r["members"]}
        kept: set[str] = set()  # members their home kept done (done is final)
        for e in rec.events:
            kind, job = e["kind"], e["job_id"]
            if kind == "enqueued" and job:
                self.fired[job] += 1
            elif kind == "batch" and (e.get("detail") or {}).get("change") == "kept_done":
                kept.add(e["detail"]["member"])
            if job in members and kind in ENDS:
                self.last[job] = (ENDS[kind], e["t"])
        for job in kept & self.last.keys():
            self.last[job] = ("done", self.last[job][1])

    def judge(self, row: dict[str, Any]) -> dict[str, Any]:
        bid, members = row["batch_id"], row["members"]
        outcomes = Counter(self.last[j][0] for j in members if j in self.last)
        ended = [self.last[j][1] for j in members if j in self.last]
        pending = len(members) - len(ended)
        closed_at = row["closed_at"]
        all_confirmed = len(row["confirmed"]) == len(members)
        due: list[str] = []
        due_at = max([closed_at or 0.0, *ended])
        if closed_at is not None and all_confirmed:
            if outcomes["dead"]:
                due.append("on_death")
            if pending == 0:
                due.append("on_complete")
                if outcomes["done"] == len(members):
                    due.append("on_success")
        fired = {k: self.fired[f"{bid}.{k}"] for k in row["callbacks"]
                 if self.fired[f"{bid}.{k}"]}
        return {"due": due, "due_at": due_at, "fired": fired,
                "settled": due_at <= self.end_t - SETTLE_S and row["gave_up"] is None,
                "outcomes": {s: outcomes[s] for s in ("done", "dead", "cancelled")},
                "added": len(members), "confirmed": len(row["confirmed"])}
