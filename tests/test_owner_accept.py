"""The owner's one path of new jobs (``owner/handlers/accept.py``): a twin in flight decides a
retry.

A single enqueue shares its in-flight twin's fate (stored: ``created`` False and no second
event; failed: it fails too); a batch waits for the twin, then checks the queue again.
The storage is the in-memory adapter, its writes held at a gate so one is in flight for sure.
"""

from __future__ import annotations

import asyncio

import pytest

from istos import Istos, StorageUnavailable
from istos.storage.base import Fence
from istos.storage.memory import MemoryStorage
from istos.transport.local import LocalMesh

BOUND_S = 5.0


class GatedStorage(MemoryStorage):
    """Memory storage whose writes wait at a gate (``held``: a write is waiting there); the
    next ``fail_next`` writes fail as in an outage."""

    def __init__(self) -> None:
        super().__init__(durable=True)
        self.gate = asyncio.Event()
        self.gate.set()
        self.held = asyncio.Event()
        self.fail_next = 0

    async def apply(self, ns: str, puts: list[tuple[str, bytes]], deletes: list[str], *,
                    fence: Fence | None = None) -> None:
        if not self.gate.is_set():
            self.held.set()
            await asyncio.wait_for(self.gate.wait(), BOUND_S)
        if self.fail_next > 0:
            self.fail_next -= 1
            raise StorageUnavailable("the gated storage refused this write (a test outage)")
        await super().apply(ns, puts, deletes, fence=fence)


async def _serving(storage: GatedStorage) -> tuple[Istos, list[str]]:
    app = Istos(transport=LocalMesh().transport("o"), storage=storage)
    app.queue("q")
    kinds: list[str] = []
    app.node.events.subscribe(lambda e: kinds.append(e.kind) if e.job_id == "j" else None)
    return app, kinds


async def _first_write_in_flight(app: Istos, storage: GatedStorage) -> asyncio.Task[bool]:
    storage.gate.clear()
    first = asyncio.ensure_future(app.owners["q"].enqueue(b"x", job_id="j"))
    await asyncio.wait_for(storage.held.wait(), BOUND_S)
    return first


@pytest.mark.parametrize("outcome", ["stored", "failed"])
async def test_a_single_enqueue_shares_its_twins_fate(outcome: str) -> None:
    storage = GatedStorage()
    app, kinds = await _serving(storage)
    async with app.serving():
        owner = app.owners["q"]
        first = await _first_write_in_flight(app, storage)
        twin = asyncio.ensure_future(owner.enqueue(b"x", job_id="j"))
        await asyncio.sleep(0)  # the twin reaches its wait on the first write
        storage.fail_next = int(outcome == "failed")  # the first write only
        storage.gate.set()
        if outcome == "stored":
            assert await asyncio.wait_for(first, BOUND_S) is True
            assert await asyncio.wait_for(twin, BOUND_S) is False
            assert kinds == ["enqueued"]  # the twin was answered by the first write
        else:
            for task in (first, twin):
                with pytest.raises(StorageUnavailable):
                    await asyncio.wait_for(task, BOUND_S)
            assert "j" not in owner.state.jobs and kinds == []


@pytest.mark.parametrize("outcome", ["stored", "failed"])
async def test_a_batch_checks_again_once_its_twin_was_written(outcome: str) -> None:
    storage = GatedStorage()
    app, kinds = await _serving(storage)
    async with app.serving():
        owner = app.owners["q"]
        first = await _first_write_in_flight(app, storage)
        batch = asyncio.ensure_future(owner.dispatch(
            {"op": "enqueue_many", "items": [{"job_id": "j", "body": b"x"}]}, trusted=True))
        await asyncio.sleep(0)
        storage.fail_next = int(outcome == "failed")  # the first write only
        storage.gate.set()
        if outcome == "stored":
            assert await asyncio.wait_for(first, BOUND_S) is True
            reply = await asyncio.wait_for(batch, BOUND_S)
            assert reply["created"] == [False]
            assert kinds == ["enqueued", "duplicate_enqueue"]
        else:
            with pytest.raises(StorageUnavailable):
                await asyncio.wait_for(first, BOUND_S)
            reply = await asyncio.wait_for(batch, BOUND_S)
            assert reply["created"] == [True]  # one twin's failure does not fail the batch
            assert owner.state.jobs["j"].body == b"x" and kinds == ["enqueued"]
