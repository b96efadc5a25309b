"""The chain invariants, over the chains the workload started (``sim/chain_workload.py``): a
step is created only after the step before it succeeded, and a step that was acked has its
successor.

Inputs are the workload's record (each chain's id and queues), the owners' events and the
side-effect ledger (``effects``: a handler that returned, whether or not its ack landed); the
checker reads no engine object. A step "was created" when an owner emitted ``enqueued`` for
``{chain id}.{step}``. A worker enqueues a step's successor after its handler returned and
before its ack, so both invariants hold at every moment of a run, with no settling time.
"""

from __future__ import annotations

from typing import Any

from .run_record import Finding, RunRecord, summary

AFTER_PREVIOUS = "a chain's step is created only after the step before it succeeded"
SUCCESSOR_MADE = "a chain step that was acked has its next step"
NAMES = (AFTER_PREVIOUS, SUCCESSOR_MADE)


def chain_findings(rec: RunRecord) -> list[Finding]:
    """The two chain invariants (see the module doc); "no chain in this run" when the workload
    started none."""
    rows = [r for r in rec.chains if r.get("chain_id")]
    if not rows:
        return [Finding(name, True, "no chain in this run") for name in NAMES]
    steps = {f"{r['chain_id']}.{k}" for r in rows for k in range(len(r["queues"]))}
    created: dict[str, float] = {}
    acked: set[str] = set()
    for e in rec.events:
        if e["job_id"] in steps:
            if e["kind"] == "enqueued":
                created.setdefault(e["job_id"], e["t"])
            elif e["kind"] == "acked":
                acked.add(e["job_id"])
    succeeded: dict[str, float] = {}
    for effect in rec.effects:
        if effect["job_id"] in steps:
            succeeded.setdefault(effect["job_id"], effect["t"])
    early: list[str] = []
    missing: list[str] = []
    for row in rows:
        too_soon, not_made = _judge(row, created, acked, succeeded)
        early += too_soon
        missing += not_made
    n = len(rows)
    return [Finding(AFTER_PREVIOUS, not early, summary(early) if early else f"{n} chains ok"),
            Finding(SUCCESSOR_MADE, not missing,
                    summary(missing) if missing else f"{n} chains ok")]


def _judge(row: dict[str, Any], created: dict[str, float], acked: set[str],
           succeeded: dict[str, float]) -> tuple[list[str], list[str]]:
    """One chain's problems: steps created too soon, successors never created."""
    early: list[str] = []
    missing: list[str] = []
    cid = row["chain_id"]
    for k in range(1, len(row["queues"])):
        step, before = f"{cid}.{k}", f"{cid}.{k - 1}"
        t = created.get(step)
        if t is not None and succeeded.get(before, float("inf")) > t:
            early.append(f"{step} created at t={t:.2f} before {before} succeeded")
        if before in acked and t is None:
            missing.append(f"{before} acked, {step} never created")
    return early, missing
