"""Invariants of leases that follow a live worker (heartbeats) and of cancellation.

Like the rest of the checker these read only the recorded rows and keep their own model:

- "no lease expired while its heart-beating holder was alive and connected": a worker declared
  with ``heartbeat=True`` renews every ``lease_s / 3``, so an expiry of a lease it held is an
  engine bug unless, between the claim and the expiry, the holder's node or the owner crashed,
  a partition separated them, the holder abandoned that delivery (the workload's ``crash_p``,
  or an ack lost by ``lose_acks``), a storage outage, or a freeze of the holder or the owner,
  overlapped the lease and lasted at least two thirds of ``lease_s`` (less a margin for a round
  trip), or the network was configured to
  lose messages, or the owner's clock jumped ahead or ran fast (a lease is measured on the owner's
  clock: the design lets that clock shorten it; a worker's clock changes nothing). A shorter
  outage or freeze explains nothing: the worker's last renewal before it left its
  lease at least that long, and a refused ack or renewal is retried until then. A scenario
  handler that abandons deliveries in other ways (raising ``CancelledError`` itself) is
  outside what this invariant can tell apart.
- "a cancelled job never runs again": after a job's ``cancelled`` event no later claim of it,
  and no side effect of a later attempt.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from .run_record import Finding, RunRecord, summary

OUTAGE_MARGIN_S = 0.1  # a renewal's round trip and commit, well above the simulated ones


def lease_findings(rec: RunRecord) -> list[Finding]:
    return [_heartbeat_leases(rec), _cancelled_stays_cancelled(rec)]


def _slot_node(worker: str | None) -> str:
    return (worker or "").rsplit(":", 1)[0]


class _Disturbances:
    """Crashes, partitions and lost acks of a run, scanned once."""

    def __init__(self, rec: RunRecord) -> None:
        self.crashes: list[tuple[float, str]] = []
        self.acks_lost: dict[str, list[float]] = defaultdict(list)
        self.cuts: list[tuple[set[str], set[str], float, float]] = []
        self.outages, self.clocks = _windows(rec, "storage_down", "storage_up"), \
            _clocks_ahead(rec)
        self.freezes = _windows(rec, "frozen", "resumed")
        open_cuts: dict[tuple[str, str], float] = {}
        for e in rec.events:
            kind, t = e["kind"], e["t"]
            if kind in ("crashed", "restarted"):
                self.crashes.append((t, e["node"]))
            elif kind in ("ack_lost", "delivery_crashed"):
                self.acks_lost[e["job_id"]].append(t)
            elif kind in ("partitioned", "healed"):
                key = (e["node"], str(e["detail"].get("other", "")))
                if kind == "partitioned":
                    open_cuts.setdefault(key, t)
                elif key in open_cuts:
                    self._cut(key, open_cuts.pop(key), t)
        for key, t in open_cuts.items():
            self._cut(key, t, float("inf"))

    def _cut(self, key: tuple[str, str], start: float, end: float) -> None:
        self.cuts.append((set(key[0].split(",")), set(key[1].split(",")), start, end))

    def explain(self, holder: str, owner: str, start: float, end: float, job_id: str,
                lease_s: float) -> bool:
        """Whether anything but the engine could explain an expiry in ``[start, end]``."""
        bridged = lease_s * 2 / 3 - OUTAGE_MARGIN_S
        if any(down <= end and up >= start and up - down >= bridged
               for down, up, _node in self.outages):
            return True
        if any(a <= end and b >= start and b - a >= bridged and node in (holder, owner)
               for a, b, node in self.freezes):
            return True
        if any(node == owner and a <= end and b >= start for a, b, node in self.clocks):
            return True
        if any(start <= t <= end for t in self.acks_lost.get(job_id, ())):
            return True
        if any(start <= t <= end and node in (holder, owner) for t, node in self.crashes):
            return True
        return any(cut_start <= end and cut_end >= start
                   and ((holder in a and owner in b) or (holder in b and owner in a))
                   for a, b, cut_start, cut_end in self.cuts)


def _windows(rec: RunRecord, begin: str, finish: str) -> list[tuple[float, float, str]]:
    """(from, to, node) of every ``begin`` ... ``finish`` window (a storage outage, a freeze)."""
    out: list[tuple[float, float, str]] = []
    since: dict[str, float] = {}
    for e in rec.events:
        if e["kind"] == begin:
            since.setdefault(e["node"], e["t"])
        elif e["kind"] == finish and e["node"] in since:
            out.append((since.pop(e["node"]), e["t"], e["node"]))
    return out + [(t, float("inf"), node) for node, t in since.items()]


def _clocks_ahead(rec: RunRecord) -> list[tuple[float, float, str]]:
    """(from, to, node) of every clock that jumped ahead (an instant) or ran fast."""
    out: list[tuple[float, float, str]] = []
    drifting: dict[str, float] = {}
    for e in rec.events:
        kind, t, node = e["kind"], e["t"], e["node"]
        if kind == "clock_stepped" and e["detail"].get("seconds", 0) > 0:
            out.append((t, t, node))
        elif kind == "clock_drifting" and e["detail"].get("rate", 1) > 1:
            drifting.setdefault(node, t)
        elif kind == "clock_drift_over" and node in drifting:
            out.append((drifting.pop(node), t, node))
    return out + [(t, float("inf"), node) for node, t in drifting.items()]


def _heartbeat_leases(rec: RunRecord) -> Finding:
    name = "no lease expired while its heart-beating holder was alive and connected"
    if not rec.heartbeat:
        return Finding(name, True, "no heart-beating worker")
    if rec.lossy:
        return Finding(name, True, "not checked: the network loses messages")
    disturbances = _Disturbances(rec)
    claims: dict[tuple[str, str, int], dict[str, Any]] = {}
    bad: list[str] = []
    checked = 0
    for e in rec.events:
        if not e["job_id"]:
            continue
        key = (e["queue"], e["job_id"], e["attempt"])
        if e["kind"] == "claimed":
            claims[key] = e
        elif e["kind"] == "lease_expired":
            claim = claims.get(key)
            holder = _slot_node(e["worker"])
            if claim is None or (holder, e["queue"]) not in rec.heartbeat:
                continue
            checked += 1
            lease_s = rec.queues[e["queue"]].policy.lease_s if e["queue"] in rec.queues else 0.0
            if not disturbances.explain(holder, e["node"], claim["t"], e["t"], e["job_id"],
                                        lease_s):
                bad.append(f"{e['job_id']}: lease of attempt {e['attempt']} held by "
                           f"{e['worker']} expired at {e['t']:.3f} with no crash or partition")
    return Finding(name, not bad, summary(bad) if bad else f"{checked} expiries explained")


def _cancelled_stays_cancelled(rec: RunRecord) -> Finding:
    cancelled: dict[tuple[str, str], dict[str, Any]] = {}
    bad: list[str] = []
    for e in rec.events:
        key = (e["queue"], e["job_id"])
        if e["kind"] == "cancelled":
            cancelled.setdefault(key, e)
        elif e["kind"] == "claimed" and key in cancelled:
            bad.append(f"{e['job_id']}: claimed at {e['t']:.3f} after it was cancelled at "
                       f"{cancelled[key]['t']:.3f}")
    attempts = defaultdict(int)
    for (queue, job), e in cancelled.items():
        attempts[(queue, job)] = e["attempt"]
    for fx in rec.effects:
        key = (fx["queue"], fx["job_id"])
        if key in cancelled and fx.get("attempt", 0) > attempts[key]:
            bad.append(f"{fx['job_id']}: attempt {fx['attempt']} ran after it was cancelled")
    return Finding("a cancelled job never runs again", not bad, summary(bad))
