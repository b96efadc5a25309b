"""Invariants of start deadlines and stored pauses, over a simulation's owner events.

The checker's own model, from events only (``enqueued`` carries a job's ``start_by`` and
``group``; ``paused`` / ``resumed`` carry the group, none for the whole queue):

- **an expired job never ran**: no handler completed it and no attempt of it was acked,
  nacked or dead-lettered; and it expired no earlier than its deadline (owner's clock);
- **no job is handed out past its start deadline unstarted**: a claim of a job that never
  started (every earlier claim of it was handed back unrun) comes before its ``start_by``;
- **no claim while paused**: no job is claimed while its queue, or its group, is paused. A
  volatile owner that restarted forgets its pauses (expected: use storage='durable'), so
  the check stops at its first restart after a pause.
"""

from __future__ import annotations

from collections import defaultdict

from .run_record import Finding, RunRecord, summary

__all__ = ["expiry_findings", "pause_findings"]

EPS = 1e-6
_RAN = ("acked", "nacked", "dead_lettered")


def expiry_findings(rec: RunRecord) -> list[Finding]:
    """The two start-deadline invariants (see the module doc)."""
    ran = {e["job_id"] for e in rec.effects}
    never: list[str] = []
    late: list[str] = []
    start_by: dict[tuple[str, str], float] = {}
    started: set[tuple[str, str]] = set()
    last: dict[tuple[str, str], str] = {}  # the job's previous event kind
    for e in rec.events:
        jid, kind = e["job_id"], e["kind"]
        if not jid:
            continue
        key = (e["queue"], jid)
        detail = e.get("detail") or {}
        if kind == "enqueued" and detail.get("start_by") is not None:
            start_by[key] = float(detail["start_by"])
        elif kind == "claimed" and key in start_by and key not in started \
                and e["t_node"] > start_by[key] + EPS:
            late.append(f"{jid}: claimed at {e['t_node']:.3f}, after its start deadline "
                        f"{start_by[key]:.3f}, never started before")
        elif kind == "expired":
            if jid in ran or key in started:
                never.append(f"{jid}: expired after it ran")
            if key in start_by and e["t_node"] + EPS < start_by[key]:
                never.append(f"{jid}: expired at {e['t_node']:.3f}, before its deadline "
                             f"{start_by[key]:.3f}")
        if kind in _RAN or kind == "lease_expired" or (
                kind == "retry_scheduled" and last.get(key) == "claimed"
                and not detail.get("spared")):
            started.add(key)  # a handed-back claim (spared, right after it) did not start
        last[key] = kind
    return [Finding("an expired job never ran", not never, summary(never)),
            Finding("no job handed out unstarted past its start deadline", not late,
                    summary(late))]


def pause_findings(rec: RunRecord) -> list[Finding]:
    """No claim while the job's queue or group is paused (see the module doc)."""
    bad: list[str] = []
    paused: dict[str, set[str | None]] = defaultdict(set)  # queue -> paused groups (None: all)
    group_of: dict[tuple[str, str], str | None] = {}
    crashes = sorted(t for t, _ in rec.owner_crashes) if rec.volatile else []
    for e in sorted(rec.events, key=lambda e: e["t"]):
        while crashes and crashes[0] <= e["t"]:
            crashes.pop(0)
            if any(paused.values()):  # a volatile owner forgot its pauses: stop judging
                return [Finding("no job claimed while its queue or group is paused", not bad,
                                summary(bad))]
        queue, kind = e["queue"], e["kind"]
        group = (e.get("detail") or {}).get("group")
        if kind == "paused":
            paused[queue].add(group)
        elif kind == "resumed":
            paused[queue].discard(group)
        elif kind == "enqueued":
            group_of[(queue, e["job_id"])] = group
        elif kind == "claimed" and paused[queue]:
            job_group = group_of.get((queue, e["job_id"]))
            if None in paused[queue] or (job_group is not None and job_group in paused[queue]):
                bad.append(f"{queue}/{e['job_id']}: claimed at {e['t']:.3f} while "
                           + ("the queue" if None in paused[queue] else f"group {job_group}")
                           + " was paused")
    return [Finding("no job claimed while its queue or group is paused", not bad, summary(bad))]

