"""The simulator's World and the public engine surfaces it reads the end of a run through."""

from __future__ import annotations

import asyncio

import pytest
from helpers import app_on
from virtual import on_virtual_loop

from istos import MemoryStorage, StorageUnavailable
from istos.transport.local import LocalMesh
from istos_nb.sim import ScenarioError, Simulation


def test_the_parts_share_one_world() -> None:
    sim = Simulation(seed=3, storage="durable")
    node = sim.node("owner")
    world = sim.world
    assert node.world is world and sim.workload.world is world
    assert sim.nodes is world.nodes and sim.events is world.events
    assert sim.shared_storage is world.shared_storage and sim.net is world.net
    assert world.storage_for() is world.shared_storage  # durable: one storage for every life
    with pytest.raises(ScenarioError, match="unknown node 'nobody'"):
        world.node("nobody")


def test_a_volatile_world_gives_each_life_its_own_storage() -> None:
    world = Simulation(seed=3).world
    assert world.storage_for() is not world.storage_for()


def test_memory_snapshot_is_a_copy_and_reads_through_an_outage() -> None:
    storage = MemoryStorage(durable=True)
    asyncio.run(storage.put("jobs:q", "a", b"1"))
    snap = storage.snapshot("jobs:q")
    snap["b"] = b"2"
    storage.available = False
    assert storage.snapshot("jobs:q") == {"a": b"1"}
    assert storage.snapshot("nothing") == {}
    with pytest.raises(StorageUnavailable):
        asyncio.run(storage.scan("jobs:q"))


@on_virtual_loop
class TestEngineSurfaces:
    async def test_held_records_are_the_serving_owners_and_none_once_stopped(self) -> None:
        mesh = LocalMesh()
        app = app_on(mesh, "owner")
        app.queue("q", lease_s=30)
        await app.start()
        ids = [await app.enqueue("q", {"i": i}) for i in range(3)]
        assert sorted(r.job_id for r in app.held_records()) == sorted(ids)
        assert {r.state for r in app.held_records()} == {"ready"}
        await app.stop()
        assert app.held_records() == []

    async def test_stop_with_grace_lets_a_running_job_finish(self) -> None:
        mesh = LocalMesh()
        app = app_on(mesh, "node", shutdown_grace_s=0.0)
        app.queue("q", lease_s=60)
        finished: list[str] = []
        started = asyncio.Event()

        @app.worker("q")
        async def slow(job: dict) -> None:
            started.set()
            await asyncio.sleep(5.0)
            finished.append(job["name"])

        await app.start()
        await app.enqueue("q", {"name": "long"})
        await asyncio.wait_for(started.wait(), 10.0)
        await app.stop(grace_s=10.0)  # the app's own grace (0 s) would cancel it
        assert finished == ["long"]
