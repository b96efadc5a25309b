"""The batch invariants: each callback at most once (and exactly once when due by the end),
and no batch count lost across owner restarts and failovers.

Inputs are the workload's record of its batches (``sim/batch_workload.py``: id, home, members and
their queues, which adds were confirmed, when the batch was closed), the owners' events and
the headers the homes kept in storage at the end. The checker keeps its own model: a member's
outcome is the last of its ``acked`` / ``dead_lettered`` / ``cancelled`` events; a callback
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
    unsettled = raced = 0
    for row in rec.batches:
        bid = row["batch_id"]
        if bid is None:
            continue
        b = model.judge(row)
        unsettled += not b["settled"]
        problems, race = _callback_problems(bid, b)
        once += problems
        raced += race
        if b["settled"]:
            counts += _count_problems(bid, b, rec.batch_headers.get(bid))
    n = sum(1 for r in rec.batches if r["batch_id"] is not None)
    tail = (f"; {unsettled} unsettled in the last {SETTLE_S:g} s" if unsettled else "") + \
        (f"; {raced} on_success before a member's late ack turned it dead (documented)"
         if raced else "")
    return [Finding(CALLBACKS_ONCE, not once, (summary(once) if once else
                                               f"{n} batches ok") + tail),
            Finding(COUNTS_KEPT, not counts, (summary(counts) if counts else
                                              f"{n} batches ok") + tail)]


def _callback_problems(bid: str, b: dict[str, Any]) -> tuple[list[str], bool]:
    """What breaks "at most once, exactly once when due" for one batch; and whether an
    on_success fired before a member turned dead (the documented race, not a failure)."""
    bad = [f"{bid}: {kind} enqueued {n} times" for kind, n in b["fired"].items() if n > 1]
    if b["settled"]:
        bad += [f"{bid}: {kind} due by t={b['due_at']:.1f} and never fired"
                for kind in b["due"] if not b["fired"].get(kind)]
    raced = False
    for kind in b["fired"]:
        if kind in b["due"]:
            continue
        if kind == "on_success" and b["raced"]:
            raced = True  # docs/batches.md: a done report before an ack that came too late
        elif b["settled"]:
            bad.append(f"{bid}: {kind} fired though its condition never held "
                       f"({b['outcomes']})")
    return bad, raced


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
        self.until = rec.until
        self.fired: Counter[str] = Counter()
        self.last: dict[str, tuple[str, float]] = {}  # member job id -> (outcome, t)
        self.expired: set[str] = set()  # members with a lease that ran out (or an owner restart)
        members = {j for r in rec.batches for j in r["members"]}
        ups: dict[str, list[float]] = {}
        claimed: dict[str, float] = {}
        queue_of = {j: q for r in rec.batches for j, q in r["members"].items()}
        for e in rec.events:
            kind, job = e["kind"], e["job_id"]
            if kind == "enqueued" and job:
                self.fired[job] += 1
            elif kind == "owner_up":
                ups.setdefault(e["queue"], []).append(e["t"])
            if job not in members:
                continue
            if kind in ENDS:
                self.last[job] = (ENDS[kind], e["t"])
            elif kind == "claimed":
                claimed.setdefault(job, e["t"])
            elif kind == "lease_expired":
                self.expired.add(job)
        for job, first in claimed.items():
            if any(t > first for t in ups.get(queue_of[job], [])):
                self.expired.add(job)

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
                "settled": due_at <= self.until - SETTLE_S and row["gave_up"] is None,
                "outcomes": {s: outcomes[s] for s in ("done", "dead", "cancelled")},
                "added": len(members), "confirmed": len(row["confirmed"]),
                "raced": any(self.last.get(j, ("",))[0] == "dead" and j in self.expired
                             for j in members)}
