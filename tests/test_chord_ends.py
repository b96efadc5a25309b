"""A chord's ends (``on_death``, ``on_complete``): a dead member no longer leaves its chord
silently open; the success callback keeps the chord's rules."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import app_on, count, wait_events

from istos import ConfigError, InvalidJob, Istos, MemoryStorage
from istos.core import batch_state as bs
from istos.owner.views.workflow_view import describe

pytestmark = pytest.mark.fast  # `make check`: no process, server or session


class Seen:
    """Bodies that reached one callback queue, with an event per arrival."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.changed = asyncio.Event()

    def add(self, body: dict[str, Any]) -> None:
        self.bodies.append(body)
        self.changed.set()

    def kinds(self) -> list[str]:
        return sorted(b["kind"] for b in self.bodies)

    async def wait(self, pred: Any, timeout_s: float = 5.0) -> None:
        async def until() -> None:
            while not pred(self):
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(until(), timeout_s)


def callbacks(app: Istos, own: tuple[str, ...] = ("reduce", "ends")) -> tuple[Seen, Seen]:
    """Workers for the chord's callback queue ``reduce`` and its ends' queue ``ends``; the
    queues in ``own`` are declared (owned) on ``app`` too."""
    for name in own:
        app.queue(name)
    reduced, ends = Seen(), Seen()

    @app.worker("reduce")
    async def reduce(body):
        reduced.add(body)

    @app.worker("ends")
    async def end(body):
        ends.add(body)

    return reduced, ends


def shards(app: Istos, dead: set[int], go: asyncio.Event | None = None) -> None:
    @app.worker("shard", concurrency=4)
    async def shard(i):
        if go is not None:
            await go.wait()
        if i in dead:
            raise RuntimeError(f"shard {i} is broken")
        return i * 10


async def test_a_dead_member_fires_on_death_and_on_complete_once_not_the_callback(mesh):
    app = app_on(mesh, "solo")
    app.queue("shard", max_attempts=1)
    reduced, ends = callbacks(app)
    shards(app, dead={1})
    async with app.serving():
        chord_id = await app.chord("shard", [0, 1, 2], callback=("reduce", "r"),
                                   on_death=("ends", "d"), on_complete=("ends", "c"))
        await ends.wait(lambda s: s.kinds() == ["on_complete", "on_death"])
        # every member ended: nothing can make the success callback due now
        await wait_events(app, lambda ev: count(ev, "acked") == 2 + 2
                          and count(ev, "dead_lettered") == 1)
        death = next(b for b in ends.bodies if b["kind"] == "on_death")
        status = await app.batch_status(death["batch_id"])
        dead = await app.dead_letters("shard")
    assert reduced.bodies == []
    assert count(app.events.recent(), "enqueued", f"{chord_id}.callback") == 0
    assert death["input"] == "d" and death["description"] == f"chord {chord_id}"
    complete = next(b for b in ends.bodies if b["kind"] == "on_complete")
    assert (complete["total"], complete["done"], complete["dead"]) == (3, 2, 1)
    assert complete["input"] == "c"
    assert status["closed"] and status["pending"] == 0
    assert status["description"] == f"chord {chord_id}"
    # the dead letter names the chord and the batch that counted its end (never a key)
    flow = dead[0]["workflow"]
    assert flow["chord"]["id"] == chord_id and flow["batch"]["id"] == death["batch_id"]
    assert "key" not in flow["batch"] and "key" not in flow["chord"]


async def test_all_done_fires_the_callback_once_and_on_complete_once(mesh):
    app = app_on(mesh, "solo")
    app.queue("shard")
    reduced, ends = callbacks(app)
    shards(app, dead=set())
    async with app.serving():
        chord_id = await app.chord("shard", [0, 1, 2], callback=("reduce", "r"),
                                   on_death=("ends", None), on_complete=("ends", None))
        await reduced.wait(lambda s: len(s.bodies) == 1)
        await ends.wait(lambda s: s.kinds() == ["on_complete"])
        await wait_events(app, lambda ev: count(ev, "acked") == 3 + 2)
    assert reduced.bodies == [{"results": [0, 10, 20], "input": "r"}]
    assert ends.bodies[0]["done"] == 3 and ends.bodies[0]["dead"] == 0
    assert count(app.events.recent(), "enqueued", f"{chord_id}.callback") == 1


async def test_a_revived_member_still_releases_the_callback(mesh):
    app = app_on(mesh, "solo")
    app.queue("shard", max_attempts=1, admin=True)
    reduced, ends = callbacks(app)
    dead = {2}
    shards(app, dead=dead)
    async with app.serving():
        chord_id = await app.chord("shard", [0, 1, 2], callback=("reduce", None),
                                   on_death=("ends", None), on_complete=("ends", None))
        await ends.wait(lambda s: s.kinds() == ["on_complete", "on_death"])
        dead.clear()
        await app.revive("shard", f"{chord_id}.2")
        await reduced.wait(lambda s: len(s.bodies) == 1)
        status = await app.batch_status(ends.bodies[0]["batch_id"])
    assert reduced.bodies == [{"results": [0, 10, 20], "input": None}]
    assert ends.kinds() == ["on_complete", "on_death"]  # each once, at the first end
    assert (status["done"], status["dead"]) == (3, 0)


async def test_ends_fire_once_across_an_owner_restart_on_durable_storage(mesh):
    storage = MemoryStorage(durable=True)
    owner1 = app_on(mesh, "owner1", storage=storage)
    owner1.queue("shard", max_attempts=1)
    owner1.queue("ends")
    cb_app = app_on(mesh, "callbacks")
    reduced, ends = callbacks(cb_app, own=("reduce",))  # "ends": the restarted owner's
    worker, go = app_on(mesh, "worker"), asyncio.Event()
    shards(worker, dead={0}, go=go)
    async with cb_app.serving(), worker.serving():
        async with owner1.serving():
            chord_id = await owner1.chord("shard", [0, 1, 2], callback=("reduce", None),
                                          on_death=("ends", None), on_complete=("ends", None))
            await wait_events(owner1, lambda ev: count(ev, "claimed") == 3)
        owner2 = app_on(mesh, "owner2", storage=storage)
        owner2.queue("shard", max_attempts=1)
        owner2.queue("ends")
        async with owner2.serving():
            go.set()
            await ends.wait(lambda s: s.kinds() == ["on_complete", "on_death"])
            bid = ends.bodies[0]["batch_id"]
            status = await owner2.batch_status(bid)
    assert reduced.bodies == []
    assert ends.kinds() == ["on_complete", "on_death"]
    assert (status["total"], status["done"], status["dead"]) == (3, 2, 1)
    assert all(status["callbacks"][k]["fired_at"] is not None
               for k in ("on_death", "on_complete"))
    assert bs.home_of(bid) == "ends" and chord_id.startswith("wf:")


async def test_malformed_ends_are_refused_before_anything_is_sent(mesh):
    app = app_on(mesh, "solo")
    app.queue("shard")
    callbacks(app)
    async with app.serving():
        with pytest.raises(ConfigError, match="on_death"):
            await app.chord("shard", [1], callback=("reduce", None),
                            on_death="ends")  # type: ignore[arg-type]
        assert app.owners["shard"].state.jobs == {}  # no member was sent


async def test_a_chord_member_with_a_forged_batch_entry_is_refused(mesh):
    app = app_on(mesh, "solo")
    app.queue("shard")
    reduced, ends = callbacks(app)
    go = asyncio.Event()
    shards(app, dead=set(), go=go)
    async with app.serving():
        chord_id = await app.chord("shard", [0, 1], callback=("reduce", None),
                                   on_complete=("ends", None))
        await wait_events(app, lambda ev: count(ev, "claimed") == 2)
        meta = app.owners["shard"].state.jobs[f"{chord_id}.0"].meta
        go.set()
        await ends.wait(lambda s: len(s.bodies) == 1)
        await reduced.wait(lambda s: len(s.bodies) == 1)
        assert not app.owners["shard"].state.holds(f"{chord_id}.0")
        # `why` of a member names the batch counting the chord's ends
        assert describe("shard", meta)["batch"] == meta["batch"]["id"]  # type: ignore[index]
        forged = {**meta["batch"], "home": "reduce"}  # the key proves another home
        with pytest.raises(InvalidJob, match="not the id of a batch"):
            await app.enqueue("shard", 0, job_id=f"{chord_id}.0",
                              _meta={"chord": meta["chord"], "batch": forged})
        with pytest.raises(InvalidJob, match="batch meta"):
            await app.enqueue("shard", 0, job_id=f"{chord_id}.0",
                              _meta={"chord": meta["chord"], "batch": {"id": "x"}})


async def test_an_empty_chord_with_ends_completes_at_once(mesh):
    app = app_on(mesh, "solo")
    app.queue("shard")
    reduced, ends = callbacks(app)
    async with app.serving():
        await app.chord("shard", [], callback=("reduce", "none"), on_death=("ends", None),
                        on_complete=("ends", "c"))
        await reduced.wait(lambda s: len(s.bodies) == 1)
        await ends.wait(lambda s: len(s.bodies) == 1)
    assert reduced.bodies == [{"results": [], "input": "none"}]
    assert ends.kinds() == ["on_complete"] and ends.bodies[0]["total"] == 0
