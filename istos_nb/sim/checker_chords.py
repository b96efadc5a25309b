"""The chord invariants, over the chords the workload opened (``sim/chord_workload.py``): a
callback only after every member ran to success, a callback once every member was acked, and
a chord stalled by a dead or cancelled member says so.

Inputs are the workload's record (each chord's id, member queue, size and callback queue),
the owners' events and the side-effect ledger (``effects``: a handler that returned, whether
or not its ack landed); the checker reads no engine object. A member's end is the last of
its ``acked`` / ``dead_lettered`` / ``cancelled`` events; the callback "fired" when an owner
emitted ``enqueued`` for ``{chord id}.callback``; a stall "was said" when the member queue's
owner emitted a ``chord`` event (``change: stalled``) naming the member after its end.

A stall that began in the last :data:`SETTLE_S` seconds of the run is not required yet (its
record may still be retrying with backoff after a storage fault): counted as unsettled in the
detail, never as a failure.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .run_record import Finding, RunRecord, summary

SETTLE_S = 60.0  # above the engine's stall-record backoff cap (30 s) plus a timeout
_ENDS = ("acked", "dead_lettered", "cancelled")
AFTER_MEMBERS = "a chord's callback fires only after every member succeeded"
FIRES_WHEN_DONE = "a chord whose members were all acked fired its callback"
STALL_SAID = "a chord stalled by a dead or cancelled member says so"
NAMES = (AFTER_MEMBERS, FIRES_WHEN_DONE, STALL_SAID)


def chord_findings(rec: RunRecord) -> list[Finding]:
    """The three chord invariants (see the module doc); "no chord in this run" when the
    workload opened none."""
    rows = [r for r in rec.chords if r.get("chord_id")]
    if not rows:
        return [Finding(name, True, "no chord in this run") for name in NAMES]
    seen = _Seen(rec, rows)
    early, unfired, unsaid = [], [], []
    unsettled = 0
    for row in rows:
        cid = row["chord_id"]
        ids = [f"{cid}.{i}" for i in range(int(row["size"]))]
        t_cb = seen.fired.get(f"{cid}.callback")
        if t_cb is not None:
            early += [f"{cid}: callback at t={t_cb:.2f} before {j} succeeded" for j in ids
                      if seen.succeeded.get(j, float("inf")) > t_cb]
            continue
        if all(seen.ends.get(j, (0.0, ""))[1] == "acked" for j in ids):
            unfired.append(f"{cid}: every member acked, no callback")
        for j in ids:
            problem = seen.unsaid_stall(j)
            if problem is None:
                continue
            if seen.ends[j][0] > rec.end_t - SETTLE_S:
                unsettled += 1
            else:
                unsaid.append(f"{cid}: {problem}")
    tail = f"; {unsettled} unsettled in the last {SETTLE_S:g} s" if unsettled else ""
    n = len(rows)
    return [Finding(AFTER_MEMBERS, not early, summary(early) if early else f"{n} chords ok"),
            Finding(FIRES_WHEN_DONE, not unfired,
                    summary(unfired) if unfired else f"{n} chords ok"),
            Finding(STALL_SAID, not unsaid,
                    (summary(unsaid) if unsaid else f"{n} chords ok") + tail)]


class _Seen:
    """What the run's events and side effects say of the recorded chords' jobs."""

    def __init__(self, rec: RunRecord, rows: list[dict[str, Any]]) -> None:
        members = {f"{r['chord_id']}.{i}" for r in rows for i in range(int(r["size"]))}
        callbacks = {f"{r['chord_id']}.callback" for r in rows}
        self.ends: dict[str, tuple[float, str]] = {}  # member -> (t, kind) of its last end
        self.fired: dict[str, float] = {}  # callback job id -> its first enqueued
        self.said: dict[str, list[float]] = defaultdict(list)  # member -> its stall events
        for e in rec.events:
            job, kind = e["job_id"], e["kind"]
            if job in members and kind in _ENDS:
                self.ends[job] = (e["t"], kind)
            elif job in callbacks and kind == "enqueued":
                self.fired.setdefault(job, e["t"])
            elif job in members and kind == "chord" \
                    and (e.get("detail") or {}).get("change") == "stalled":
                self.said[job].append(e["t"])
        self.succeeded: dict[str, float] = {}  # member -> first side effect (it returned)
        for effect in rec.effects:
            if effect["job_id"] in members:
                self.succeeded.setdefault(effect["job_id"], effect["t"])

    def unsaid_stall(self, job_id: str) -> str | None:
        """What is wrong when member ``job_id`` ended dead or cancelled and no stall event
        named it after (None: it did not, or one did)."""
        t_end, kind = self.ends.get(job_id, (0.0, ""))
        if kind not in ("dead_lettered", "cancelled") \
                or any(t >= t_end for t in self.said.get(job_id, ())):
            return None
        return f"member {job_id} {kind} at t={t_end:.2f}, no stall said"
