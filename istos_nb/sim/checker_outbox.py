"""The outbox invariant: a job exists iff its transaction committed, and one job per row.

Inputs are the simulation's record of outbox transactions (one row per job id written:
``job_id``, ``queue``, ``committed``), the owners' ``enqueued`` events, the handlers' side
effects and the job ids still waiting in the outbox at the end. The checker reads no engine
object: a row "became a job" when an owner emitted ``enqueued`` for its id.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def outbox_counts(txns: list[dict[str, Any]], events: list[dict[str, Any]],
                  effects: list[dict[str, Any]], waiting: set[str]) -> dict[str, int]:
    """``committed``, ``rolled_back``, ``jobs`` (committed rows that became a job),
    ``waiting`` (committed, still in the outbox), ``lost`` (committed, neither), ``phantom``
    (rolled back, yet a job or a side effect), ``twice`` (a row that made more than one job)."""
    made = Counter(e["job_id"] for e in events if e["kind"] == "enqueued")
    ran = {e["job_id"] for e in effects}
    committed = {t["job_id"] for t in txns if t["committed"]}
    rolled = {t["job_id"] for t in txns if not t["committed"]}
    return {
        "committed": len(committed),
        "rolled_back": len(rolled),
        "jobs": sum(1 for j in committed if made[j]),
        "waiting": sum(1 for j in committed if not made[j] and j in waiting),
        "lost": sum(1 for j in committed if not made[j] and j not in waiting),
        "phantom": sum(1 for j in rolled if made[j] or j in ran),
        "twice": sum(1 for j in committed if made[j] > 1),
    }


def outbox_finding(txns: list[dict[str, Any]], events: list[dict[str, Any]],
                   effects: list[dict[str, Any]], waiting: set[str]) -> tuple[bool, str]:
    """Whether the invariant holds, and the counts that say so."""
    c = outbox_counts(txns, events, effects, waiting)
    ok = c["lost"] == 0 and c["phantom"] == 0 and c["twice"] == 0
    return ok, (f"{c['committed']} committed rows: {c['jobs']} became jobs, {c['waiting']} "
                f"still in the outbox, {c['lost']} lost, {c['twice']} made more than one job; "
                f"{c['rolled_back']} rolled back: {c['phantom']} became jobs")
