"""Trace: a queue's recorded traffic, in the form replay needs it.

A :class:`Trace` holds the owner's events for one queue (the facts) and its declared policy; its
tables are derived from the events: ``jobs`` (arrival, priority, delay, body size), ``attempts``
(per delivery its worker, claim time, run time and outcome), ``fleet`` (worker nodes, slots,
concurrency) and ``crashes`` (worker nodes that vanished while holding leases). Times in the
tables are seconds since the trace's first arrival, whatever clock the events came from.

Build one with :meth:`Trace.from_events` (an event list or frame: a simulation's, a saved
``istos follow --json`` stream, the owner's ring), with ``LiveQueue.record(seconds)``, or read
one with :meth:`Trace.load` (the file ``istos record`` writes; see ``istos.tracefile``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from istos import events as ev
from istos import tracefile
from istos.tracefile import TraceFormatError

from ..views.frames import EventsLike, depth_frame, events_frame, leases_frame, worker_node

__all__ = ["Trace", "TraceFormatError"]

_FINISHED = ("acked", "nacked")


@dataclass
class Trace:
    """One queue's recorded events, policy and (optionally) bodies; see the module docstring."""

    queue: str
    policy: dict[str, Any]
    events: list[dict[str, Any]] = field(repr=False)
    bodies: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)
    source: str = "events"
    dropped: int = 0

    # -- building ------------------------------------------------------------------------------
    @classmethod
    def from_events(cls, events: EventsLike, *, queue: str | None = None,
                    policy: Mapping[str, Any] | None = None, source: str = "events") -> Trace:
        """A trace of ``events`` (JobEvents, their dicts, or an events frame).

        ``queue``: which queue to keep (default: the only one in the stream; ValueError when
        there are several). ``policy``: the queue's declared options (``stats()["policy"]``);
        without it the lease is read from the claims and the rest are Istos's defaults.
        Events of node crashes and restarts (a simulation's) are kept: they time the crashes.
        """
        df = events_frame(events)
        rows = [_row(r) for r in df.itertuples(index=False)]
        names = sorted({r["queue"] for r in rows if r["queue"] and r["job_id"]})
        if queue is None:
            if len(names) > 1:
                raise ValueError(f"the events hold several queues {names}; pass queue=")
            queue = names[0] if names else ""
        kept = [r for r in rows if r["queue"] == queue or not r["job_id"]]
        return cls(queue=queue, policy=dict(policy or _policy_from(kept)), events=kept,
                   source=source)

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read a trace file (``istos record``'s or :meth:`save`'s). Raises TraceFormatError
        naming the line for anything else, and for a version newer than this one reads."""
        head, events, bodies = tracefile.read_trace(path)
        return cls(queue=head["queue"], policy=dict(head["policy"]), events=events,
                   bodies={b["body_of"]: b for b in bodies}, source=str(head.get("source")),
                   dropped=int(head.get("dropped") or 0))

    def save(self, path: str | Path) -> None:
        """Write the trace as versioned JSON lines (gzip when ``path`` ends in ``.gz``)."""
        ts = [e["t"] for e in self.events]
        head = tracefile.header(self.queue, self.policy, self.events,
                                started=min(ts, default=0.0), ended=max(ts, default=0.0),
                                source=self.source, dropped=self.dropped)
        tracefile.write_trace(path, head, self.events, self.bodies.values())

    # -- what it holds --------------------------------------------------------------------------
    @cached_property
    def t0(self) -> float:
        """The first arrival's time on the events' clock (the tables' zero)."""
        ts = [e["t"] for e in self.events if e["kind"] == ev.ENQUEUED]
        return min(ts) if ts else min((e["t"] for e in self.events), default=0.0)

    @property
    def span_s(self) -> float:
        """Seconds from the first arrival to the last event."""
        return max((e["t"] for e in self.events), default=self.t0) - self.t0

    @cached_property
    def jobs(self) -> pd.DataFrame:
        """One row per job enqueued in the trace: job_id, arrival (s), priority, delay_s, size
        (body bytes, when the recording kept bodies; else NA). Jobs the stream saw only later
        in their life (enqueued before the recording began) are left out: replay cannot know
        when they arrived."""
        rows, seen = [], set()
        for e in self.events:
            if e["kind"] == ev.ENQUEUED and e["job_id"] not in seen:
                seen.add(e["job_id"])
                d = e["detail"]
                body = self.bodies.get(e["job_id"])
                rows.append((e["job_id"], e["t"] - self.t0, int(d.get("priority") or 0),
                             float(d.get("delay_s") or 0.0),
                             body["size"] if body else None))
        df = pd.DataFrame(rows, columns=["job_id", "arrival", "priority", "delay_s", "size"])
        return df.astype({"arrival": "float64", "priority": "int64", "delay_s": "float64",
                          "size": "Int64"})

    @cached_property
    def attempts(self) -> pd.DataFrame:
        """One row per delivery of a job in :attr:`jobs`: job_id, attempt, worker, node,
        claimed (s), run_s (claim to ack/nack; NaN otherwise), outcome (acked, nacked,
        expired, cancelled, open), error, crashed (its lease ran out because its node died)."""
        leases = leases_frame(self.events)
        leases = leases[leases["job_id"].isin(set(self.jobs["job_id"]))].copy()
        # A delivery lost to a crash: it expired on a node that had died by then (claimed
        # before the crash, or granted to the dead node's parked claim before it came back).
        down = {c["node"]: (c["t"], math.inf if c["restart_after"] is None
                            else c["t"] + c["restart_after"]) for c in self.crashes}
        out = pd.DataFrame({
            "job_id": leases["job_id"], "attempt": leases["attempt"],
            "worker": leases["worker"], "node": leases["node"],
            "claimed": leases["start"] - self.t0,
            "run_s": (leases["end"] - leases["start"]).where(
                leases["outcome"].isin(_FINISHED)),
            "outcome": leases["outcome"], "error": leases["error"]})
        out["crashed"] = [o == "expired" and n in down and c <= down[n][1]
                          for o, n, c in zip(out["outcome"], out["node"], out["claimed"],
                                             strict=True)]
        return out.reset_index(drop=True)

    @cached_property
    def fleet(self) -> pd.DataFrame:
        """Worker nodes seen claiming: node, slots (slot ids seen), concurrency (the most
        deliveries it held at once)."""
        rows = tracefile.fleet_of(self.events)
        return pd.DataFrame(rows, columns=["node", "slots", "concurrency"])

    @cached_property
    def crashes(self) -> list[dict[str, Any]]:
        """Worker nodes that died holding leases: ``{"node", "t", "restart_after"}`` (t in
        trace seconds; restart_after None when it never came back). From the simulator's
        crashed/restarted events when the stream has them; otherwise inferred: a node whose
        leases expired and that never acted again died right after its last act."""
        marked = self._marked_crashes()
        return marked if marked is not None else self._inferred_crashes()

    def _marked_crashes(self) -> list[dict[str, Any]] | None:
        crashed = [e for e in self.events if e["kind"] == ev.CRASHED]
        if not crashed:
            return None
        nodes = set(self.fleet["node"])
        out = []
        for e in crashed:
            if e["node"] not in nodes:
                continue
            back = next((r["t"] for r in self.events if r["kind"] == ev.RESTARTED
                         and r["node"] == e["node"] and r["t"] >= e["t"]), None)
            out.append({"node": e["node"], "t": e["t"] - self.t0,
                        "restart_after": None if back is None else back - e["t"]})
        return out

    def _inferred_crashes(self) -> list[dict[str, Any]]:
        """A node died right after its last act if its leases expired and it never acted
        again, or if jobs waited for a claim long after its last act (it vanished idle)."""
        last_act: dict[str, float] = {}
        first_expiry: dict[str, float] = {}
        for e in self.events:
            node = worker_node(e["worker"])
            if node is None:
                continue
            if e["kind"] == ev.LEASE_EXPIRED:
                first_expiry.setdefault(node, e["t"])
            elif e["kind"] in (ev.CLAIMED, ev.ACKED, ev.NACKED, ev.LEASE_EXTENDED):
                last_act[node] = e["t"]
        out = []
        for node, last in sorted(last_act.items()):
            silent_since_expiry = node in first_expiry and last < first_expiry[node]
            if silent_since_expiry or self._starved_after(last):
                out.append({"node": node, "t": last - self.t0, "restart_after": None})
        return out

    def _starved_after(self, t: float) -> bool:
        """Whether jobs stood ready after ``t`` for longer than any recorded run: a live node
        with a free slot would have claimed them."""
        leases = leases_frame(self.events)  # not self.attempts: that needs the crashes
        done = leases[leases["outcome"].isin(_FINISHED)]
        longest = float((done["end"] - done["start"]).max()) if len(done) else 1.0
        patience = 2.0 * longest + 1.0
        depth = depth_frame(self.events)
        ready = depth[depth["t"] > t + patience]
        return bool(len(ready)) and bool((ready["ready"] > 0).any())

    def run_times(self) -> pd.Series:
        """The recorded run times of finished deliveries (what replay draws from)."""
        return self.attempts["run_s"].dropna().reset_index(drop=True)

    def summary(self) -> str:
        a = self.attempts
        counts = a["outcome"].value_counts().to_dict()
        return (f"trace of {self.queue!r}: {len(self.jobs)} jobs over {self.span_s:.0f} s, "
                f"{len(a)} deliveries ({', '.join(f'{k} {v}' for k, v in counts.items())}), "
                f"{len(self.fleet)} worker nodes, {len(self.crashes)} crashes"
                + (f", {self.dropped} events dropped" if self.dropped else ""))


def _row(r: Any) -> dict[str, Any]:
    detail = r.detail if isinstance(r.detail, dict) else {}
    return {"t": float(r.t), "node": r.node or "", "queue": r.queue or "",
            "job_id": r.job_id or "", "kind": r.kind, "attempt": int(r.attempt),
            "worker": r.worker, "detail": {k: v for k, v in detail.items()
                                           if not (isinstance(v, float) and math.isnan(v))}}


def _policy_from(events: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """What the events say of the policy: the lease of the claims (replay takes Istos's
    defaults for the rest)."""
    leases = [e["detail"].get("lease_s") for e in events if e["kind"] == ev.CLAIMED]
    lease = next((x for x in leases if isinstance(x, (int, float))), None)
    return {"lease_s": float(lease)} if lease else {}
