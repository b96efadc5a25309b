"""Invariant checks over a simulation's record, and Jepsen-style delivery counts.

The checker keeps its own model of what the owner may do (it does not call the engine), so an
engine bug shows up as a disagreement. Inputs are plain rows: owner events (with ``t`` the true
time and ``t_node`` the emitting node's clock), the workload's enqueue attempts and the side
effects handlers completed.

Counts follow Jepsen's total-queue checker: ``ok`` (accepted and processed), ``lost`` (accepted,
never processed, held neither by a serving owner nor in storage), ``duplicated`` (processed more
than once), ``unexpected`` (processed but never enqueued), ``recovered`` (the producer saw an
error, yet it was processed), plus ``stranded``: accepted, never processed, still in storage,
yet held by no serving owner (a frozen, fenced or stale owner sitting on it), so nobody will
ever run it.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from istos.core.backoff import delay_bounds
from istos.core.config import QueueConfig

from .checker_leases import lease_findings

EPS = 1e-6


@dataclass
class RunRecord:
    events: list[dict[str, Any]]
    attempts: list[dict[str, Any]]  # job_id, queue, status ("ok" | "failed"), t
    effects: list[dict[str, Any]]  # job_id, queue, node, t (a handler completed)
    queues: dict[str, QueueConfig]
    held: set[str]  # job ids still held (pending or dead) by serving owners at the end
    volatile: bool
    owner_crashes: list[tuple[float, str]] = field(default_factory=list)  # (t, node)
    heartbeat: set[tuple[str, str]] = field(default_factory=set)  # (node, queue) heart-beating
    lossy: bool = False  # the network was configured to lose messages at some point
    stored: set[str] = field(default_factory=set)  # job ids in durable storage at the end


@dataclass
class Finding:
    invariant: str
    ok: bool
    detail: str


def delivery_counts(rec: RunRecord) -> dict[str, int]:
    done = Counter(e["job_id"] for e in rec.effects)
    known = {e["job_id"] for e in rec.events if e["kind"] == "enqueued"}
    tried = [a for a in rec.attempts if a["job_id"] is not None]
    accepted = [a for a in tried if a["status"] == "ok"]
    unheld = [a for a in accepted if done[a["job_id"]] == 0 and a["job_id"] not in rec.held]
    lost = [a for a in unheld if a["job_id"] not in rec.stored]
    stranded = [a for a in unheld if a["job_id"] in rec.stored]
    expected = [a for a in lost if _lost_to_volatile_restart(rec, a)]
    return {
        "attempted": len(rec.attempts),
        "accepted": len(accepted),
        "ok": sum(1 for a in accepted if done[a["job_id"]] > 0),
        "lost": len(lost) - len(expected),
        "lost_expected": len(expected),
        "stranded": len(stranded),
        "duplicated": sum(1 for n in done.values() if n > 1),
        "unexpected": sum(1 for j in done if j not in known),
        "recovered": sum(1 for a in tried if a["status"] != "ok" and done[a["job_id"]] > 0),
        "pending": sum(1 for a in accepted if done[a["job_id"]] == 0
                       and a["job_id"] in rec.held),
    }


def _lost_to_volatile_restart(rec: RunRecord, attempt: dict[str, Any]) -> bool:
    return rec.volatile and any(t >= attempt["t"] for t, _ in rec.owner_crashes)


def check(rec: RunRecord) -> list[Finding]:
    counts = delivery_counts(rec)
    lost_detail = f"{counts['lost']} lost"
    if counts["lost_expected"]:
        lost_detail += (f"; {counts['lost_expected']} lost to a volatile owner restart "
                        "(expected: use storage='durable')")
    findings = [Finding("no accepted job lost", counts["lost"] == 0, lost_detail),
                Finding("no accepted job stranded (in storage, served by nobody)",
                        counts["stranded"] == 0, f"{counts['stranded']} stranded")]
    findings += [
        _single_lease(rec), _attempts_bounded(rec), _backoff_respected(rec),
        _dead_after_max(rec), _fifo_within_priority(rec), _chord_once(rec),
        *lease_findings(rec),
    ]
    return findings


def _by_job(events: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["job_id"]:
            out[(e["queue"], e["job_id"])].append(e)
    return out


def _single_lease(rec: RunRecord) -> Finding:
    bad: list[str] = []
    for (_q, job), evs in _by_job(rec.events).items():
        open_lease: dict[str, dict[str, Any]] = {}  # owner node -> claimed event
        for e in evs:
            node, kind = e["node"], e["kind"]
            if kind == "claimed":
                prev = open_lease.get(node)
                if prev is not None:
                    bad.append(f"{job}: attempt {e['attempt']} leased at {e['t']:.3f} while "
                               f"attempt {prev['attempt']} was still leased")
                open_lease[node] = e
            elif kind in ("acked", "nacked", "lease_expired"):
                prev = open_lease.get(node)
                if kind == "lease_expired" and e["t_node"] + EPS < e["detail"]["deadline"]:
                    bad.append(f"{job}: lease reclaimed at {e['t_node']:.3f} before its "
                               f"deadline {e['detail']['deadline']:.3f} on the owner's clock")
                if prev is not None and prev["attempt"] == e["attempt"]:
                    del open_lease[node]
    return Finding("one live lease per job (by the owner's clock)", not bad, _summary(bad))


def _attempts_bounded(rec: RunRecord) -> Finding:
    limit = {q: c.policy.max_attempts for q, c in rec.queues.items()}
    bad = [f"{e['job_id']}: attempt {e['attempt']} > max {limit[e['queue']]}"
           for e in rec.events if e["kind"] == "claimed" and e["queue"] in limit
           and e["attempt"] > limit[e["queue"]]]
    return Finding("attempts <= max_attempts", not bad, _summary(bad))


def _dead_after_max(rec: RunRecord) -> Finding:
    bad = [f"{e['job_id']}: dead after {e['attempt']} attempts"
           for e in rec.events if e["kind"] == "dead_lettered" and e["queue"] in rec.queues
           and e["attempt"] < rec.queues[e["queue"]].policy.max_attempts]
    return Finding("dead only after max_attempts", not bad, _summary(bad))


def _backoff_respected(rec: RunRecord) -> Finding:
    bad: list[str] = []
    for (queue, job), evs in _by_job(rec.events).items():
        config = rec.queues.get(queue)
        if config is None:
            continue
        ready_at: dict[str, float] = {}
        after_nack = False
        for e in evs:
            kind, node = e["kind"], e["node"]
            if kind == "nacked":
                after_nack = True
            elif kind == "retry_scheduled":
                delay = e["detail"]["delay_s"]
                if after_nack:
                    lo, hi = delay_bounds(e["attempt"], config.policy.backoff)
                    if not lo - EPS <= delay <= hi + EPS:
                        bad.append(f"{job}: retry after attempt {e['attempt']} waits "
                                   f"{delay:.3f} s, outside [{lo:.3f}, {hi:.3f}]")
                ready_at[node] = e["detail"]["ready_at"]
                after_nack = False
            elif kind == "claimed":
                due = ready_at.pop(node, None)
                if due is not None and e["t_node"] + EPS < due:
                    bad.append(f"{job}: attempt {e['attempt']} claimed {due - e['t_node']:.3f} s "
                               "before its backoff ended")
    return Finding("retry delays respect the backoff policy", not bad, _summary(bad))


def _fifo_within_priority(rec: RunRecord) -> Finding:
    """Replay each owner's ready set; every claim must take the best job that was ready."""
    bad: list[str] = []
    models: dict[tuple[str, str], _ReadyModel] = defaultdict(_ReadyModel)
    for e in rec.events:
        kind = e["kind"]
        # Durable storage is one queue whatever replica leads it (HA): one model per queue,
        # so a job finished under one leader is not still "ready" in another's model.
        key = (e["node"], e["queue"]) if rec.volatile else ("", e["queue"])
        if kind in ("owner_up",) and rec.volatile:
            models[key] = _ReadyModel()
        if not e["job_id"]:
            continue
        model = models[key]
        if kind == "enqueued":
            model.add(e["job_id"], e["detail"]["priority"], e["detail"]["ready_at"])
        elif kind == "retry_scheduled":
            model.add(e["job_id"], model.priority.get(e["job_id"], 0), e["detail"]["ready_at"])
        elif kind == "claimed":
            skipped = model.claim(e["job_id"], e["t_node"])
            if skipped is not None:
                bad.append(f"{e['job_id']} claimed at {e['t']:.3f} while {skipped} was "
                           "ready earlier at the same or a higher priority")
        elif kind in ("acked", "dead_lettered", "purged", "result_expired"):
            model.drop(e["job_id"])
    return Finding("priority, then FIFO among ready jobs", not bad, _summary(bad))


class _ReadyModel:
    def __init__(self) -> None:
        self.priority: dict[str, int] = {}
        self.key: dict[str, tuple[int, float, int]] = {}
        self._delayed: list[tuple[float, int, str]] = []
        self._ready: list[tuple[int, float, int, str]] = []
        self._seq = 0

    def add(self, job: str, priority: int, ready_at: float) -> None:
        self._seq += 1
        self.priority[job] = priority
        self.key[job] = (-priority, ready_at, self._seq)
        heapq.heappush(self._delayed, (ready_at, self._seq, job))

    def drop(self, job: str) -> None:
        self.key.pop(job, None)

    def claim(self, job: str, now: float) -> str | None:
        while self._delayed and self._delayed[0][0] <= now + EPS:
            ready_at, seq, j = heapq.heappop(self._delayed)
            if self.key.get(j, (0, 0, -1))[2] == seq:
                heapq.heappush(self._ready, (*self.key[j], j))
        mine = self.key.pop(job, None)
        while self._ready and self.key.get(self._ready[0][3], (0, 0, -1))[2] != \
                self._ready[0][2]:
            heapq.heappop(self._ready)
        if mine is None or not self._ready:
            return None
        best = self._ready[0]
        if best[:2] < mine[:2]:
            return best[3]
        return None


def _chord_once(rec: RunRecord) -> Finding:
    created = Counter(e["job_id"] for e in rec.events
                      if e["kind"] == "enqueued" and e["job_id"].endswith(".callback"))
    bad = [f"chord callback {j} enqueued {n} times" for j, n in created.items() if n > 1]
    return Finding("chord callback fires exactly once", not bad, _summary(bad))


def _summary(bad: list[str]) -> str:
    if not bad:
        return "ok"
    more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
    return "; ".join(bad[:3]) + more
