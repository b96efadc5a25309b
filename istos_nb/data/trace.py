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
from istos.errors import ConfigError
from istos.tracefile import TraceFormatError

from .frames import EventsLike, events_frame, leases_frame
from .trace_crashes import infer_crashes, marked_crashes

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

        ``queue``: which queue to keep (default: the only one in the stream;
        :class:`ConfigError`, a ``ValueError``, when there are several). ``policy``: the
        queue's declared options (``stats()["policy"]``); without it the lease is read from
        the claims and the rest are Istos's defaults. Events of node crashes and restarts (a
        simulation's) are kept: they time the crashes. Raises :class:`ConfigError` or
        ``TypeError`` for events that are not events (see
        :func:`~istos_nb.data.frames.events_frame`).
        """
        df = events_frame(events)
        rows = [_row(r) for r in df.itertuples(index=False)]
        names = sorted({r["queue"] for r in rows if r["queue"] and r["job_id"]})
        if queue is None:
            if len(names) > 1:
                raise ConfigError(f"the events hold several queues {names}; pass queue=")
            queue = names[0] if names else ""
        kept = [r for r in rows if r["queue"] == queue or not r["job_id"]]
        return cls(queue=queue, policy=dict(policy or _policy_from(kept)), events=kept,
                   source=source)

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """Read a trace file (``istos record``'s or :meth:`save`'s). Raises TraceFormatError
        naming the line for anything else, and for a version newer than this one reads;
        ``OSError`` when the file cannot be read."""
        return cls.from_recording(*tracefile.read_trace(path))

    @classmethod
    def from_recording(cls, head: Mapping[str, Any], events: list[dict[str, Any]],
                       bodies: Iterable[dict[str, Any]] = ()) -> Trace:
        """A trace of a recording's parts (a trace file's header, checked events and bodies:
        :class:`istos.client.record.Recording`, or what :func:`istos.tracefile.read_trace`
        read). The parts must be what those readers checked; raises ``KeyError`` for a header
        without ``queue`` or ``policy``."""
        return cls(queue=head["queue"], policy=dict(head["policy"]), events=events,
                   bodies={b["body_of"]: b for b in bodies}, source=str(head.get("source")),
                   dropped=int(head.get("dropped") or 0))

    def save(self, path: str | Path) -> None:
        """Write the trace as versioned JSON lines (gzip when ``path`` ends in ``.gz``), which
        :meth:`load` reads back to an equal trace. Raises ``OSError`` when the file cannot be
        written."""
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
    def frame(self) -> pd.DataFrame:
        """:attr:`events` as one normalised events frame
        (:func:`~istos_nb.data.frames.events_frame`), built once: the other frame builders
        take it as it is, so a trace's tables and charts do not normalise the events again."""
        return events_frame(self.events)

    @cached_property
    def _leases(self) -> pd.DataFrame:
        """The leases frame of :attr:`events`, built once for :attr:`attempts` and the crash
        table (neither modifies it)."""
        return leases_frame(self.frame)

    @cached_property
    def jobs(self) -> pd.DataFrame:
        """One row per job enqueued in the trace: job_id, arrival (s), priority, delay_s, size
        (body bytes, when the recording kept bodies; else NA), expires_s (its start deadline
        after its arrival; NaN: none). Jobs the stream saw only later
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
                             body["size"] if body else None, _expires_s(d)))
        df = pd.DataFrame(rows, columns=["job_id", "arrival", "priority", "delay_s", "size",
                                         "expires_s"])
        return df.astype({"arrival": "float64", "priority": "int64", "delay_s": "float64",
                          "size": "Int64", "expires_s": "float64"})

    @cached_property
    def attempts(self) -> pd.DataFrame:
        """One row per delivery of a job in :attr:`jobs`: job_id, attempt, worker, node,
        claimed (s), run_s (claim to ack/nack; NaN otherwise), outcome (acked, nacked,
        expired, cancelled, open), error, crashed (its lease ran out because its node died)
        and crash (which of :attr:`crashes` cost it; -1 for none)."""
        leases = self._leases
        leases = leases[leases["job_id"].isin(set(self.jobs["job_id"]))].copy()
        cost = {key: i for i, c in enumerate(self._crash_table) for key in c[3]}
        out = pd.DataFrame({
            "job_id": leases["job_id"], "attempt": leases["attempt"],
            "worker": leases["worker"], "node": leases["node"],
            "claimed": leases["start"] - self.t0,
            "run_s": (leases["end"] - leases["start"]).where(
                leases["outcome"].isin(_FINISHED)),
            "outcome": leases["outcome"], "error": leases["error"]})
        out["crash"] = [cost.get((str(j), int(a)), -1)
                        for j, a in zip(out["job_id"], out["attempt"], strict=True)]
        out["crashed"] = (out["crash"] >= 0) & (out["outcome"] == "expired")
        return out.reset_index(drop=True)

    @cached_property
    def fleet(self) -> pd.DataFrame:
        """Worker nodes seen claiming: node, slots (slot ids seen), concurrency (the most
        deliveries it held at once). A node restarted under its own id is one node."""
        rows = tracefile.fleet_of(self.events)
        return pd.DataFrame(rows, columns=["node", "slots", "concurrency"])

    @property
    def crashes(self) -> list[dict[str, Any]]:
        """Worker nodes that died holding leases: ``{"node", "t", "restart_after"}`` in time
        order (t in trace seconds; restart_after None when it never came back; a node may die
        more than once). From the simulator's crashed/restarted events when the stream has
        them; otherwise inferred (see :mod:`istos_nb.data.trace_crashes`): a node that
        abandoned every delivery it held died at its last act before that, and came back
        (under the same node id) at its next act, if any."""
        return [{"node": node, "t": t - self.t0,
                 "restart_after": None if back is None else back - t}
                for node, t, back, _lost in self._crash_table]

    @cached_property
    def _crash_table(self) -> list[tuple[str, float, float | None, list[tuple[str, int]]]]:
        """(node, t, back, lost deliveries) per crash, times on the events' clock."""
        leases = self._leases
        nodes = set(self.fleet["node"])
        marked = marked_crashes(self.events, leases, nodes)
        return marked if marked is not None else infer_crashes(self.events, leases)

    def run_times(self) -> pd.Series:
        """The recorded run times of finished deliveries (what replay draws from)."""
        return self.attempts["run_s"].dropna().reset_index(drop=True)

    def summary(self) -> str:
        """One line for a human: the queue, jobs and span, deliveries by outcome, worker
        nodes, crashes, and dropped events if any. Never raises."""
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


def _expires_s(detail: dict[str, Any]) -> float:
    """An ``enqueued`` event's start deadline, in seconds after the owner accepted the job
    (its ``ready_at`` less its ``delay_s``, both by the owner's clock, as ``start_by`` is);
    NaN for none."""
    start_by, ready_at = detail.get("start_by"), detail.get("ready_at")
    if not isinstance(start_by, (int, float)) or not isinstance(ready_at, (int, float)):
        return float("nan")
    return float(start_by) - (float(ready_at) - float(detail.get("delay_s") or 0.0))
