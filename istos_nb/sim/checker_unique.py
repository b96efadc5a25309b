"""The unique-key invariant: never two jobs holding one key, each within its own scope.

The checker's own model of ``istos.core.unique`` (it does not call the engine): from the owner
events, a job with a key (``enqueued`` with ``unique_key``) holds it, by its scope, until its
first ``claimed`` (``queued``), until it ended (``active``: ``acked``, ``dead_lettered``,
``cancelled`` or ``expired``), or until ``unique_s`` after it ended (``finished``), on its
owner's clock. An ``enqueued`` job with a key while another job holds that key is a violation.
A volatile owner that restarted in between forgot its keys (expected: use storage='durable').
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .run_record import Finding, RunRecord, summary

EPS = 1e-6
ENDS = ("acked", "dead_lettered", "cancelled", "expired")  # (expired: a start deadline)


@dataclass
class _Holder:
    job_id: str
    scope: str
    unique_s: float
    node: str
    t: float  # true time it was enqueued
    claimed: bool = False
    ended_at: float | None = None  # its owner's clock

    def holds(self, node: str, t_node: float) -> bool:
        if self.scope == "queued":
            return not self.claimed and self.ended_at is None
        if self.ended_at is None:
            return True
        # A window is judged on one owner's clock only (another node's clock is skewed).
        return self.scope == "finished" and node == self.node \
            and t_node + EPS < self.ended_at + self.unique_s


def unique_finding(rec: RunRecord) -> Finding:
    bad: list[str] = []
    holders: dict[tuple[str, str], _Holder] = {}  # (queue, key) -> the key's latest job
    of_job: dict[tuple[str, str], _Holder] = {}  # (queue, job id) -> its holder entry
    for e in rec.events:
        job, kind = e["job_id"], e["kind"]
        if not job:
            continue
        if kind == "enqueued":
            _enqueued(rec, e, holders, of_job, bad)
            continue
        holder = of_job.get((e["queue"], job))
        if holder is None:
            continue
        if kind == "claimed":
            holder.claimed = True
        elif kind in ENDS:
            holder.ended_at = e["t_node"]
    return Finding("never two jobs holding one unique key within its scope", not bad,
                   summary(bad))


def _enqueued(rec: RunRecord, e: dict[str, Any], holders: dict[tuple[str, str], _Holder],
              of_job: dict[tuple[str, str], _Holder], bad: list[str]) -> None:
    detail = e["detail"]
    key = detail.get("unique_key")
    if key is None:
        return
    slot = (e["queue"], key)
    prev = holders.get(slot)
    if prev is not None and prev.job_id != e["job_id"] and prev.holds(e["node"], e["t_node"]) \
            and not (rec.volatile and any(prev.t <= t <= e["t"] for t, _ in rec.owner_crashes)):
        bad.append(f"{e['job_id']}: enqueued with unique key {key!r} while {prev.job_id} "
                   f"held it ({prev.scope})")
    holder = _Holder(e["job_id"], detail.get("unique") or "active",
                     float(detail.get("unique_s") or 0.0), e["node"], e["t"])
    holders[slot] = holder
    of_job[(e["queue"], e["job_id"])] = holder
