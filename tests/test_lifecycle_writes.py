"""Write, then apply, for unique keys, debounce and edits: a key whose first write is in
flight makes the next enqueue with it wait for that write; a failed write of an edit or of a
debounce call leaves the job as it was. In-memory durable storage whose writes wait at a gate
(or fail), as in test_owner_accept."""

from __future__ import annotations

import asyncio

import pytest
from test_owner_accept import BOUND_S, GatedStorage

from istos import Istos, StorageUnavailable
from istos.transport.local import LocalMesh


def _msg(job_id: str, **extra: object) -> dict[str, object]:
    return {"op": "enqueue", "body": b"x", "job_id": job_id, **extra}


@pytest.mark.parametrize("outcome", ["stored", "failed"])
async def test_an_enqueue_waits_for_the_write_of_its_keys_first_job(outcome: str) -> None:
    storage = GatedStorage()
    app = Istos(transport=LocalMesh().transport("o"), storage=storage)
    app.queue("q")
    async with app.serving():
        owner = app.owners["q"]
        storage.gate.clear()
        first = asyncio.ensure_future(owner.dispatch(_msg("a", unique={"key": "k"}),
                                                     trusted=True))
        await asyncio.wait_for(storage.held.wait(), BOUND_S)
        second = asyncio.ensure_future(owner.dispatch(_msg("b", unique={"key": "k"}),
                                                      trusted=True))
        await asyncio.sleep(0)  # the second reaches its wait on the first write
        storage.fail_next = int(outcome == "failed")  # the first write only
        storage.gate.set()
        one = await asyncio.wait_for(first, BOUND_S)
        two = await asyncio.wait_for(second, BOUND_S)
        if outcome == "stored":
            assert one["created"] and two == {**two, "job_id": "a", "created": False,
                                                "reason": "unique_key"}
        else:
            assert one["ok"] is False and one["error"] == "StorageUnavailable"
            assert two["created"] and two["job_id"] == "b"  # the key was free again
        assert sorted(owner.state.jobs) == (["a"] if outcome == "stored" else ["b"])


async def test_a_failed_write_leaves_an_edited_or_debounced_job_as_it_was() -> None:
    storage = GatedStorage()
    app = Istos(transport=LocalMesh().transport("o"), storage=storage)
    app.queue("q")
    async with app.serving():
        owner = app.owners["q"]
        jid = await app.enqueue("q", {"v": 1}, delay_s=3600)
        burst = await app.enqueue("q", {"v": 1}, debounce_key="d", debounce_s=3600)
        before = {j: (r.body, r.priority, r.ready_at, r.state, r.edits)
                  for j, r in owner.state.jobs.items()}
        storage.fail_next = 1
        with pytest.raises(StorageUnavailable):
            await app.update("q", jid, data={"v": 2}, priority=9, delay_s=0)
        storage.fail_next = 1
        with pytest.raises(StorageUnavailable):
            await app.enqueue("q", {"v": 3}, debounce_key="d", debounce_s=3600)
        after = {j: (r.body, r.priority, r.ready_at, r.state, r.edits)
                 for j, r in owner.state.jobs.items()}
        assert after == before and owner.state.counts["delayed"] == 2
        assert burst in owner.state.jobs
        assert await app.update("q", jid, priority=9) == "updated"  # storage is back
