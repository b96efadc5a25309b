"""Batches in a simulation: a workload that opens, fills and closes them, and its record.

``sim.open_batches(node, n, members={"a": 10, "b": 10}, callbacks="cb")`` schedules ``n``
batch scenarios on ``node``: each opens a batch (its callbacks on ``callbacks``, which is also
its home), adds members on several queues, then closes it. Every step is retried with
backoff on virtual time while the node or an owner does not answer, with the same member job
ids (``batch.add`` is idempotent by job id), so a fault delays a batch but does not change it.

The record (one row per batch: its id, home, the member ids it added and whether each add was
confirmed, when it was closed) and the headers its home kept in storage at the end are what
the checker's batch invariants read (``checker_batches.py``); the checker reads no engine
object. Needs ``Simulation(storage="durable")``: a volatile home forgets its batches when it
restarts, by design.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgpack

from istos.core.batch_state import KINDS, BatchHeader

from .workload_steps import ScenarioWorld, retried

if TYPE_CHECKING:
    from istos.storage.memory import MemoryStorage

    from .simnode import SimNode


class SimBatches:
    """The batches a simulated workload opened, recorded for the checker."""

    def __init__(self, world: ScenarioWorld) -> None:
        self.world = world
        self.rows: list[dict[str, Any]] = []

    async def run_one(self, node: SimNode, members: dict[str, int], callbacks: str,
                      job_ids: list[str], close: bool) -> None:
        """Open one batch through ``node``, add ``members`` (queue -> count, interleaved)
        with ``job_ids``, then close it (if ``close``); every step retried (module doc)."""
        row: dict[str, Any] = {"batch_id": None, "home": callbacks, "node": node.name,
                               "opened_at": self.world.now(), "members": {},
                               "confirmed": set(), "closed_at": None,
                               "callbacks": list(KINDS), "gave_up": None}
        self.rows.append(row)
        batch = await retried(row, "open", lambda: node.app.batch(
            on_success=(callbacks, "s"), on_complete=(callbacks, "c"),
            on_death=(callbacks, "d"), description=f"sim batch {len(self.rows)}"))
        if batch is None:
            return
        row["batch_id"] = batch.id
        order = [q for i in range(max(members.values(), default=0))
                 for q, n in members.items() if i < n]
        for queue, job_id in zip(order, job_ids, strict=False):
            row["members"][job_id] = queue

            async def add(queue: str = queue, job_id: str = job_id) -> str:
                return str(await batch.add(queue, {"member": job_id}, job_id=job_id))

            if await retried(row, f"add {job_id}", add) is None:
                return
            row["confirmed"].add(job_id)
        if close and await retried(row, "close", batch.close, want=True) is not None:
            row["closed_at"] = self.world.now()

    def headers(self, storage: MemoryStorage) -> dict[str, dict[str, Any] | None]:
        """Each recorded batch's header as its home stored it (None: not in storage)."""
        out: dict[str, dict[str, Any] | None] = {}
        for row in self.rows:
            bid = row["batch_id"]
            if bid is None:
                continue
            raw = storage.snapshot(f"batch:{row['home']}:{bid}").get("h")
            out[bid] = None if raw is None else BatchHeader.decode(
                msgpack.unpackb(raw, raw=False)).status(bid, row["home"])
        return out

    def record(self) -> list[dict[str, Any]]:
        """The rows, copied (sets as sorted lists), for the run's result."""
        return [{**r, "members": dict(r["members"]), "confirmed": sorted(r["confirmed"])}
                for r in self.rows]
