"""What a simulation hands its checker: the run's record, and a finding per invariant.

The checker (``checker.py``) and its parts (``checker_leases.py``, ``checker_logs.py``) all
read a :class:`RunRecord` and answer with :class:`Finding` rows; the record holds only rows the
simulation recorded from the event stream, its own workload and the engine's public surfaces.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from istos.core.config import QueueConfig

__all__ = ["RunRecord", "Finding", "summary"]


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
    # The job-log ledger (what handler attempts wrote: job_id, queue, attempt, lines) and what
    # the owners kept at the end (queue, job_id, attempt, outcome, logs, logs_dropped).
    logs: list[dict[str, Any]] = field(default_factory=list)
    kept_logs: list[dict[str, Any]] = field(default_factory=list)
    # Outbox transactions (job_id, queue, committed) and the ids still in the outbox at the end.
    outbox: list[dict[str, Any]] = field(default_factory=list)
    outbox_waiting: set[str] = field(default_factory=set)
    # The run's end, true time: where it stopped (an interrupted run's is before the end it was
    # asked to run to), which may come long after its last event.
    end_t: float = 0.0
    # Batches the workload opened (sim/batch_workload.py) and their headers in storage at the end.
    batches: list[dict[str, Any]] = field(default_factory=list)
    batch_headers: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    # Chords the workload opened (sim/chord_workload.py): id, member queue, size, callback.
    chords: list[dict[str, Any]] = field(default_factory=list)
    # Chains the workload started (sim/chain_workload.py): id and queues.
    chains: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Finding:
    invariant: str
    ok: bool
    detail: str


def summary(bad: list[str]) -> str:
    """A finding's detail: "ok", or the first three problems and how many more there are."""
    if not bad:
        return "ok"
    more = f" (+{len(bad) - 3} more)" if len(bad) > 3 else ""
    return "; ".join(bad[:3]) + more
