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
from typing import Any

from istos.core.backoff import delay_bounds

from .checker_batches import batch_findings
from .checker_chains import chain_findings
from .checker_chords import chord_findings
from .checker_deps import deps_findings
from .checker_expiry import expiry_findings, pause_findings
from .checker_leases import lease_findings
from .checker_logs import job_log_finding
from .checker_outbox import outbox_finding
from .checker_unique import unique_finding
from .run_record import Finding, RunRecord, summary

__all__ = ["RunRecord", "Finding", "check", "delivery_counts", "EPS"]

EPS = 1e-6


def delivery_counts(rec: RunRecord) -> dict[str, int]:
    done = Counter(e["job_id"] for e in rec.effects)
    # (a job enqueued with after= is accepted as "waiting", with no "enqueued" event)
    known = {e["job_id"] for e in rec.events if e["kind"] in ("enqueued", "waiting")}
    tried = [a for a in rec.attempts if a["job_id"] is not None]
    # A job that expired (its start deadline passed, checker_expiry.py) ended unrun by design.
    expired = {e["job_id"] for e in rec.events if e["kind"] == "expired"}
    accepted = [a for a in tried if a["status"] == "ok"]
    unheld = [a for a in accepted if done[a["job_id"]] == 0 and a["job_id"] not in rec.held
              and a["job_id"] not in expired]
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
                       and a["job_id"] in rec.held and a["job_id"] not in expired),
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
        _dedup_windows(rec), _rate_limits(rec), _group_limits(rec), *lease_findings(rec),
        job_log_finding(rec), unique_finding(rec), *expiry_findings(rec), *pause_findings(rec),
        *deps_findings(rec),
        *batch_findings(rec), *chord_findings(rec), *chain_findings(rec),
    ]
    if rec.outbox:
        ok, detail = outbox_finding(rec.outbox, rec.events, rec.effects, rec.outbox_waiting)
        findings.append(Finding("outbox: a job iff its transaction committed, one per row",
                                ok, detail))
    return findings


def _by_job(events: list[dict[str, Any]]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    out: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["job_id"]:
            out[(e["queue"], e["job_id"])].append(e)
    return out


def _single_lease(rec: RunRecord) -> Finding:
    bad: list[str] = []
    # An owner that serves again after another did (an HA failover back to it) starts from
    # storage: the leases of its previous term were the other's to end, and their events are.
    ups = [(e["t"], e["node"]) for e in rec.events if e["kind"] == "owner_up"]
    for (_q, job), evs in _by_job(rec.events).items():
        open_lease: dict[str, dict[str, Any]] = {}  # owner node -> claimed event
        for e in evs:
            node, kind = e["node"], e["kind"]
            if kind == "claimed":
                prev = open_lease.get(node)
                if prev is not None and any(prev["t"] < t <= e["t"] and other != node
                                            for t, other in ups):
                    prev = None
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
            elif kind == "retry_scheduled" and e["detail"].get("spared"):
                # A release (its worker handed it back unrun or at shutdown) ends the lease
                # with no other event; its attempt was given back, so the numbers differ.
                open_lease.pop(node, None)
    return Finding("one live lease per job (by the owner's clock)", not bad, summary(bad))


def _attempts_bounded(rec: RunRecord) -> Finding:
    limit = {q: c.policy.max_attempts for q, c in rec.queues.items()}
    bad = [f"{e['job_id']}: attempt {e['attempt']} > max {limit[e['queue']]}"
           for e in rec.events if e["kind"] == "claimed" and e["queue"] in limit
           and e["attempt"] > limit[e["queue"]]]
    return Finding("attempts <= max_attempts", not bad, summary(bad))


def _dead_after_max(rec: RunRecord) -> Finding:
    bad = [f"{e['job_id']}: dead after {e['attempt']} attempts"
           for e in rec.events if e["kind"] == "dead_lettered" and e["queue"] in rec.queues
           and e["attempt"] < rec.queues[e["queue"]].policy.max_attempts]
    return Finding("dead only after max_attempts", not bad, summary(bad))


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
                asked = e["detail"].get("retry_after")
                if after_nack and asked is not None:  # istos.Retry: the worker's wait, capped
                    want = min(asked, config.policy.backoff.max_s)
                    if abs(delay - want) > EPS:
                        bad.append(f"{job}: Retry(after_s={asked:g}) after attempt "
                                   f"{e['attempt']} waits {delay:.3f} s, not {want:.3f}")
                elif after_nack:
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
    return Finding("retry delays respect the backoff policy", not bad, summary(bad))


def _fifo_within_priority(rec: RunRecord) -> Finding:
    """Replay each owner's ready set; every claim must take the best job that was ready in its
    group (groups take turns, ``core/groups.py``: the order holds within each group)."""
    bad: list[str] = []
    models: dict[tuple[str, str, str | None], _ReadyModel] = defaultdict(_ReadyModel)
    group_of: dict[str, str] = {}
    for e in rec.events:
        kind = e["kind"]
        # Durable storage is one queue whatever replica leads it (HA): one model per queue,
        # so a job finished under one leader is not still "ready" in another's model.
        key = (e["node"], e["queue"]) if rec.volatile else ("", e["queue"])
        if kind in ("owner_up",) and rec.volatile:
            for stale in [k for k in models if k[:2] == key]:
                models[stale] = _ReadyModel()
        if not e["job_id"]:
            continue
        if kind == "enqueued" and e["detail"].get("group") is not None:
            group_of[e["job_id"]] = e["detail"]["group"]
        model = models[(key[0], key[1], group_of.get(e["job_id"]))]
        if kind == "enqueued":
            model.add(e["job_id"], e["detail"]["priority"], e["detail"]["ready_at"])
        elif kind in ("retry_scheduled", "unblocked"):  # (a waiting job: ready once unblocked)
            model.add(e["job_id"], e["detail"].get("priority", model.priority.get(e["job_id"], 0)),
                      e["detail"]["ready_at"])
        elif kind == "updated" and e["job_id"] in model.key:  # app.update or a debounce call
            d, old = e["detail"], model.key[e["job_id"]]
            model.add(e["job_id"], d.get("priority", model.priority.get(e["job_id"], 0)),
                      d.get("ready_at", old[1]))
        elif kind == "claimed":
            skipped = model.claim(e["job_id"], e["t_node"])
            if skipped is not None:
                bad.append(f"{e['job_id']} claimed at {e['t']:.3f} while {skipped} was "
                           "ready earlier at the same or a higher priority")
        elif kind in ("acked", "dead_lettered", "cancelled", "purged", "result_expired",
                      "expired"):
            model.drop(e["job_id"])  # (a job cancelled while it waited is ready no more)
    return Finding("priority, then FIFO among ready jobs", not bad, summary(bad))


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
    return Finding("chord callback fires exactly once", not bad, summary(bad))


def _dedup_windows(rec: RunRecord) -> Finding:
    """An id enqueued with ``dedup_s`` is not enqueued again (a second job) within ``dedup_s``
    of its job finishing, by the owner's clock. A volatile owner that restarted in between
    forgot its marks (expected: use storage='durable')."""
    bad: list[str] = []
    window: dict[tuple[str, str], float] = {}
    ended: dict[tuple[str, str], tuple[str, float, float]] = {}  # node, t_node, t
    for e in rec.events:
        key, kind = (e["queue"], e["job_id"]), e["kind"]
        if not e["job_id"]:
            continue
        if kind == "enqueued":
            prev = ended.pop(key, None)
            dedup = window.get(key)
            if prev is not None and dedup is not None and prev[0] == e["node"] \
                    and e["t_node"] + EPS < prev[1] + dedup \
                    and not (rec.volatile and any(prev[2] <= t <= e["t"]
                                                  for t, _ in rec.owner_crashes)):
                bad.append(f"{e['job_id']}: enqueued again {e['t_node'] - prev[1]:.3f} s "
                           f"after it finished, inside its {dedup:g} s dedup window")
            window[key] = e["detail"].get("dedup_s") or 0.0
        elif kind in ("acked", "dead_lettered", "cancelled"):
            ended[key] = (e["node"], e["t_node"], e["t"])
    return Finding("no second job for an id inside its dedup window", not bad, summary(bad))


def _rate_limits(rec: RunRecord) -> Finding:
    """A queue declared with ``rate_limit=(n, per_s)`` never hands out more than ``n`` claims
    in any window of ``per_s`` seconds of its owner's clock. Each owner's life is judged on its
    own: a restarted (or newly elected) owner starts with a full bucket."""
    bad: list[str] = []
    limits = {q: c.policy.rate_limit for q, c in rec.queues.items() if c.policy.rate_limit}
    if not limits:
        return Finding("claims within the rate limit", True, "no rate-limited queue")
    claims: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    life: Counter[tuple[str, str]] = Counter()
    for e in rec.events:
        queue = e["queue"]
        if queue not in limits:
            continue
        if e["kind"] == "owner_up":
            life[(e["node"], queue)] += 1
        elif e["kind"] == "claimed":
            claims[(e["node"], queue, life[(e["node"], queue)])].append(e["t_node"])
    for (node, queue, _), times in claims.items():
        breach = _window_breach(times, *limits[queue])
        if breach:
            bad.append(f"{queue} on {node}: {breach}")
    return Finding("claims within the rate limit", not bad, summary(bad))


def _window_breach(times: list[float], n: int, per_s: float) -> str | None:
    """Where ``n + 1`` of ``times`` fall inside one window of ``per_s`` seconds, if anywhere."""
    times = sorted(times)
    for i in range(len(times) - n):
        if times[i + n] - times[i] < per_s - EPS:
            return (f"{n + 1} claims within {times[i + n] - times[i]:.3f} s from "
                    f"{times[i]:.3f} (limit {n} per {per_s:g} s)")
    return None


def _group_limits(rec: RunRecord) -> Finding:
    """A queue with ``group_concurrency`` never has more leased jobs of one group at once, and
    one with ``group_rate_limit=(n, per_s)`` never more than ``n`` claims of one group in any
    ``per_s`` seconds of an owner's life (as :func:`_rate_limits`). Groups come from the
    ``enqueued`` events; a lease is open from ``claimed`` until the owner ends that attempt."""
    bad: list[str] = []
    queues = {q: c.policy for q, c in rec.queues.items()
              if c.policy.group_concurrency or c.policy.group_rate_limit}
    if not queues:
        return Finding("group limits held", True, "no queue with group limits")
    group: dict[tuple[str, str], str] = {}
    held: dict[tuple[str, str, str], set[str]] = defaultdict(set)  # ids with an open lease
    claims: dict[tuple[str, str, str, int], list[float]] = defaultdict(list)
    life: Counter[tuple[str, str]] = Counter()
    for e in rec.events:
        q, node, kind = e["queue"], e["node"], e["kind"]
        if q not in queues:
            continue
        if kind == "owner_up":  # a new life: its bucket is full, its restored leases unseen
            life[(node, q)] += 1
            for key in [k for k in held if k[0] == node and k[1] == q]:
                del held[key]
            continue
        g = group.get((q, e["job_id"]))
        if kind == "enqueued" and e["detail"].get("group") is not None:
            group[(q, e["job_id"])] = e["detail"]["group"]
        elif kind == "claimed" and g is not None:
            open_ = held[(node, q, g)]
            open_.add(e["job_id"])
            cap = queues[q].group_concurrency
            if cap is not None and len(open_) > cap:
                bad.append(f"{q}/{g}: {len(open_)} leased at {e['t']:.3f} (cap {cap})")
            claims[(node, q, g, life[(node, q)])].append(e["t_node"])
        elif kind in ("acked", "nacked", "lease_expired", "retry_scheduled") and g is not None:
            held[(node, q, g)].discard(e["job_id"])  # (retry_scheduled: also a release)
    for (node, q, g, _), times in claims.items():
        limit = queues[q].group_rate_limit
        breach = None if limit is None else _window_breach(times, *limit)
        if breach:
            bad.append(f"{q}/{g} on {node}: {breach}")
    return Finding("group limits held", not bad, summary(bad))
