"""Chains in a simulation: a workload that starts them, and its record.

``sim.open_chains(node, n, queues=["a", "b", "c"])`` schedules ``n`` chains on ``node``, each
running its steps on ``queues`` in order (a step's return value is the next step's data).
Starting is retried with backoff on virtual time while the node or an owner does not answer;
a retry starts a new chain (a chain's id is random), so only the chain whose start answered
is recorded.

The record (one row per chain: its id and queues) is what the checker's chain invariants read
with the run's events and side effects (``checker_chains.py``); the checker reads no engine
object.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .workload_steps import ScenarioWorld, retried

if TYPE_CHECKING:
    from .simnode import SimNode


class SimChains:
    """The chains a simulated workload started, recorded for the checker."""

    def __init__(self, world: ScenarioWorld) -> None:
        self.world = world
        self.rows: list[dict[str, Any]] = []

    async def run_one(self, node: SimNode, queues: list[str]) -> None:
        """Start one chain through ``node`` (retried: module doc)."""
        row: dict[str, Any] = {"chain_id": None, "queues": list(queues), "node": node.name,
                               "started_at": None, "gave_up": None}
        self.rows.append(row)
        first = await retried(row, "start", lambda: node.app.chain(list(queues), {"step": 0}))
        if first is not None:
            row["chain_id"] = str(first).rpartition(".")[0]
            row["started_at"] = self.world.now()

    def record(self) -> list[dict[str, Any]]:
        """The rows, copied, for the run's result."""
        return [{**r, "queues": list(r["queues"])} for r in self.rows]
