"""The dependency invariants: no child ran before its parents were done, and no child whose
parents all finished done is left waiting.

The checker's own model of ``istos.core.deps`` (it does not call the engine). The workload
records each child's parents and ``on_parent_failure`` with its enqueue attempt
(``SimNode.enqueue_after``); the owner events say when each job was claimed and ended:

- **ran after its parents**: a child's first ``claimed`` event comes after every parent's
  first ``acked`` (with ``"run"``: after every parent's first end, ``acked``,
  ``dead_lettered``, ``cancelled`` or ``expired``), unless an operator forced it
  (``unblocked`` with ``forced``);
- **not left waiting**: a child that waited (``waiting``) whose parents were all ``acked``
  at least :data:`SETTLE_S` before the run's end was ``unblocked`` or ended by then
  (reports are retried with a backoff capped at 30 s). A volatile owner that restarted after
  the child was accepted forgot it (expected: use storage='durable').
"""

from __future__ import annotations

from typing import Any

from .run_record import Finding, RunRecord, summary

EPS = 1e-6
SETTLE_S = 70.0
ENDS = ("acked", "dead_lettered", "cancelled", "expired")
RAN_AFTER = "no child ran before its parents were done"
NOT_LEFT = "a child whose parents all finished done is not left waiting"


def deps_findings(rec: RunRecord) -> list[Finding]:
    children = [a for a in rec.attempts if a.get("after") and a["status"] == "ok"]
    if not children:
        none = "no job was enqueued with after="
        return [Finding(RAN_AFTER, True, none), Finding(NOT_LEFT, True, none)]
    first: dict[tuple[str, str, str], float] = {}  # (queue, job, kind) -> first true time
    forced: set[tuple[str, str]] = set()
    for e in rec.events:
        job = e["job_id"]
        if not job:
            continue
        first.setdefault((e["queue"], job, e["kind"]), e["t"])
        if e["kind"] == "unblocked" and e["detail"].get("forced"):
            forced.add((e["queue"], job))
    end_of_run = max(rec.end_t, max((e["t"] for e in rec.events), default=0.0))
    ran_early: list[str] = []
    left: list[str] = []
    for child in children:
        key = (child["queue"], child["job_id"])
        parents = [(str(q), str(j)) for q, j in child["after"]]
        claimed = first.get((key[0], key[1], "claimed"))
        if claimed is not None and key not in forced:
            for parent in parents:
                ended = _ended(first, parent, child["mode"])
                if ended is None or ended > claimed + EPS:
                    ran_early.append(f"{key[1]}: claimed at {claimed:.3f}, parent {parent[1]} "
                                     f"{'ended' if child['mode'] == 'run' else 'done'} at "
                                     f"{'never' if ended is None else f'{ended:.3f}'}")
        if (key[0], key[1], "waiting") not in first or _forgotten(rec, child):
            continue
        acked = [first.get((parent[0], parent[1], "acked")) for parent in parents]
        if any(t is None or t > end_of_run - SETTLE_S for t in acked):
            continue
        moved = [first.get((key[0], key[1], kind)) for kind in ("unblocked", "cancelled")]
        if not any(t is not None for t in moved):
            left.append(f"{key[1]}: still waiting, its parents all done by "
                        f"{max(t for t in acked if t is not None):.3f}")
    return [Finding(RAN_AFTER, not ran_early, summary(ran_early)),
            Finding(NOT_LEFT, not left, summary(left))]


def _ended(first: dict[tuple[str, str, str], float], parent: tuple[str, str],
           mode: str) -> float | None:
    if mode != "run":
        return first.get((parent[0], parent[1], "acked"))
    ends = [first[(parent[0], parent[1], kind)] for kind in ENDS
            if (parent[0], parent[1], kind) in first]
    return min(ends) if ends else None


def _forgotten(rec: RunRecord, child: dict[str, Any]) -> bool:
    return rec.volatile and any(t >= child["t"] for t, _ in rec.owner_crashes)
