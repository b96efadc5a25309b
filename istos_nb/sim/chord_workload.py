"""Chords in a simulation: a workload that opens them (and cancels some members), and its
record.

``sim.open_chords(node, n, queue="shard", size=4, callback="reduce", cancel=1)`` schedules
``n`` chord scenarios on ``node``: each opens a chord of ``size`` members on ``queue`` with its
callback on ``callback``, then cancels its last ``cancel`` members (``queue`` needs
``admin=True`` for that). Opening is retried with backoff on virtual time while the node or an
owner does not answer; a retry opens a new chord (a chord's id is random), so only the chord
whose opening answered is recorded. Each cancel is retried until an owner answers it, and
what it answered is recorded (``cancelled`` while the member waited, ``cancelling`` while it
ran, ``too_late`` once it had ended).

The record (one row per chord: its id, member queue, size, callback queue, the cancels and
their answers) is what the checker's chord invariants read with the run's events and side
effects (``checker_chords.py``); the checker reads no engine object.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .workload_steps import ScenarioWorld, retried

if TYPE_CHECKING:
    from .simnode import SimNode


class SimChords:
    """The chords a simulated workload opened, recorded for the checker."""

    def __init__(self, world: ScenarioWorld) -> None:
        self.world = world
        self.rows: list[dict[str, Any]] = []

    async def run_one(self, node: SimNode, queue: str, size: int, callback: str,
                      cancel: int) -> None:
        """Open one chord through ``node``, then cancel its last ``cancel`` members; every
        step retried (module doc)."""
        row: dict[str, Any] = {"chord_id": None, "queue": queue, "size": size,
                               "callback": callback, "node": node.name,
                               "opened_at": None, "cancels": {}, "gave_up": None}
        self.rows.append(row)
        items = [{"member": i} for i in range(size)]
        chord_id = await retried(row, "open", lambda: node.app.chord(
            queue, items, callback=(callback, "in")))
        if chord_id is None:
            return
        row["chord_id"], row["opened_at"] = str(chord_id), self.world.now()
        for index in range(size - cancel, size):
            job_id = f"{chord_id}.{index}"

            async def cancel_one(job_id: str = job_id) -> str:
                return str(await node.app.cancel(queue, job_id))

            status = await retried(row, f"cancel {job_id}", cancel_one)
            if status is None:
                return
            row["cancels"][index] = status

    def record(self) -> list[dict[str, Any]]:
        """The rows, copied, for the run's result."""
        return [{**r, "cancels": dict(r["cancels"])} for r in self.rows]
