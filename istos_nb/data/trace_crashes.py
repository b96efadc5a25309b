"""When did a worker node die, and did it come back? Read from a trace's events.

A simulator's stream says so (its ``crashed``/``restarted`` node events); a live owner's does
not: a killed worker process just stops acting, and a new process under the same node id has the
same slot ids (``node:function#i``) as the one it replaces. So a live crash is inferred from the
one thing no live worker does: abandon what it holds. A crash is a *silence* of the node (from one
of its acts, a claim, ack, nack or renewal, to its next) at whose start every delivery it held
was lost (none is ever acked or nacked: they expire, or are still leased when the trace ends), and
one of these says the holder is gone rather than slow:

1. the node never acts again (the old rule: it died and stayed dead);
2. the slot of a lost delivery claims again while that delivery's lease still runs: a live slot
   is busy until it ends its job, so a new process took the slot over (a restart under the same
   name, before the old leases ran out);
3. the silence lasts longer than ``patience`` (twice the longest recorded run, plus a second):
   nothing it held ended, and no slow job of the queue takes that long (a restart after the old
   leases ran out).

The silence's start dates the crash (the node's last act before it) and its end the restart (its
first act back). A node that held nothing when it vanished is a crash only if it never came back
and jobs then stood ready longer than ``patience`` (:func:`starved_after`): a restart of an idle
node leaves nothing in the events to tell it from a pause.

Where it breaks: a single-slot worker whose job runs past its lease for longer than
``patience`` looks like a crash and restart (its late ack is refused without an event); a
restart of a worker that held nothing is not seen.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

import pandas as pd

from istos import events as ev

from .frames import depth_frame, worker_node

__all__ = ["infer_crashes", "marked_crashes", "patience_s", "starved_after"]

Key = tuple[str, int]  # (job_id, attempt): one delivery
_ACTS = (ev.CLAIMED, ev.ACKED, ev.NACKED, ev.LEASE_EXTENDED)
_LOST = ("expired", "open")  # never ended by its holder


def patience_s(leases: pd.DataFrame) -> float:
    """How long a live node may stay silent: twice the longest finished run, plus a second."""
    done = leases[leases["outcome"].isin(("acked", "nacked"))]
    longest = float((done["end"] - done["start"]).max()) if len(done) else 1.0
    return 2.0 * longest + 1.0


def starved_after(events: Sequence[dict[str, Any]], t: float, patience: float) -> bool:
    """Whether jobs stood ready after ``t + patience``: a live node with a free slot would have
    claimed them."""
    depth = depth_frame(events)
    ready = depth[depth["t"] > t + patience]
    return bool(len(ready)) and bool((ready["ready"] > 0).any())


def infer_crashes(events: Sequence[dict[str, Any]], leases: pd.DataFrame
                  ) -> list[tuple[str, float, float | None, list[Key]]]:
    """``(node, t, back, lost)`` per inferred crash, in time order: the node's last act before
    it died, its first act back (None: never), and the deliveries the crash cost."""
    acts: dict[str, list[float]] = {}
    for e in events:
        node = worker_node(e["worker"])
        if node is not None and e["kind"] in _ACTS:
            acts.setdefault(node, []).append(float(e["t"]))
    patience = patience_s(leases)
    claims: dict[str, list[float]] = {}  # slot -> its claim times, sorted
    for w, s in sorted(zip(leases["worker"].astype(str), leases["start"], strict=True),
                       key=lambda p: p[1]):
        claims.setdefault(w, []).append(float(s))
    found = []
    for node, times in sorted(acts.items()):
        rows = leases[leases["node"] == node]
        found += _node_crashes(node, sorted(set(times)), rows, claims, patience)
    for node, times in sorted(acts.items()):
        if not any(c[0] == node for c in found) and starved_after(events, max(times), patience):
            found.append((node, max(times), None, []))  # vanished idle, never came back
    return sorted(found, key=lambda c: c[1])


def _node_crashes(node: str, times: list[float], rows: pd.DataFrame,
                  claims: dict[str, list[float]], patience: float
                  ) -> list[tuple[str, float, float | None, list[Key]]]:
    """The crashes of one node: its silences whose held deliveries were all lost, judged latest
    first so each lost delivery belongs to the last silence before its slot was taken over."""
    deliveries = [(float(r.start), math.inf if pd.isna(r.end) else float(r.end),
                   (str(r.job_id), int(r.attempt)), str(r.worker), str(r.outcome))
                  for r in rows.itertuples(index=False)]
    deliveries.sort(key=lambda d: d[0])
    candidates = []  # (c, r, lost) where everything held at c was lost
    held: dict[Key, tuple[float, float, str, str]] = {}  # key -> (start, end, slot, outcome)
    ends: list[tuple[float, Key]] = []
    kept = 0  # held deliveries that their holder ended itself
    nxt = 0
    for i, c in enumerate(times):
        while nxt < len(deliveries) and deliveries[nxt][0] <= c:
            start, end, key, slot, outcome = deliveries[nxt]
            held[key] = (start, end, slot, outcome)
            kept += outcome not in _LOST
            heapq.heappush(ends, (end, key))
            nxt += 1
        while ends and ends[0][0] <= c:  # ended at or before this act
            _end, key = heapq.heappop(ends)
            kept -= held.pop(key)[3] not in _LOST
        if held and kept == 0 and any(h[3] == "expired" for h in held.values()):
            back = times[i + 1] if i + 1 < len(times) else None
            candidates.append((c, back, dict(held)))
    out: list[tuple[str, float, float | None, list[Key]]] = []
    taken: set[Key] = set()
    for c, back, lost in reversed(candidates):
        # Still held at c, in the owner's eyes, but abandoned earlier (its slot has claimed
        # since: a new process runs it) belongs to an earlier crash, not to this silence.
        free = {k: v for k, v in lost.items() if k not in taken
                and not _claims_between(claims.get(v[2], []), v[0], c, inclusive=True)}
        if not free:
            continue
        if back is None or back - c > patience or any(
                _claims_between(claims.get(slot, []), c, end)
                for _start, end, slot, _o in free.values()):
            out.append((node, c, back, sorted(lost)))
            taken.update(lost)
    return out[::-1]


def _claims_between(times: list[float], after: float, before: float,
                    inclusive: bool = False) -> bool:
    """Whether a claim in ``times`` (sorted) falls in (after, before), or (after, before]."""
    i = bisect_right(times, after)
    return i < len(times) and (times[i] <= before if inclusive else times[i] < before)


def marked_crashes(events: Sequence[dict[str, Any]], leases: pd.DataFrame,
                   nodes: set[str]) -> list[tuple[str, float, float | None, list[Key]]] | None:
    """The crashes a simulator's stream marks (None when it marks none), in the same form as
    :func:`infer_crashes`: a crash cost the deliveries of its node that expired after it and were
    claimed before the node came back (a parked claim may be granted to the dead node)."""
    crashed = [e for e in events if e["kind"] == ev.CRASHED]
    if not crashed:
        return None
    out = []
    taken: set[Key] = set()
    for e in sorted(crashed, key=lambda e: e["t"]):
        if e["node"] not in nodes:
            continue
        t = float(e["t"])
        back = next((float(r["t"]) for r in events if r["kind"] == ev.RESTARTED
                     and r["node"] == e["node"] and r["t"] >= t), None)
        mine = leases[(leases["node"] == e["node"]) & (leases["outcome"] == "expired")
                      & (leases["end"] >= t)
                      & (leases["start"] <= (math.inf if back is None else back))]
        lost = [k for k in zip(mine["job_id"].astype(str), mine["attempt"].astype(int),
                               strict=True) if k not in taken]
        taken.update(lost)
        out.append((str(e["node"]), t, back, sorted(lost)))
    return out
