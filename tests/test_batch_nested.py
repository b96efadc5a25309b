"""Nested batches: a child batch counts as one member of its parent and ends in it as a member
would (done, dead), also across a restart of the child's home (durable storage); a finished
batch is pruned a day later, looking only at the oldest finished batches."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import app_on, wait_events
from test_batch import Callbacks, declare

from istos import ConfigError, InvalidJob, Istos, JobContext, MemoryStorage
from istos.clock import ManualClock
from istos.core import batch_state as bs
from istos.owner.extensions.batches_ext import TOMBSTONE_TTL_S

pytestmark = pytest.mark.fast  # `make check`: no process, server or session


async def test_a_child_batch_is_one_member_of_its_parent(mesh):
    app, cbs = app_on(mesh, "solo"), Callbacks()
    declare(app, cbs)
    async with app.serving():
        parent = await app.batch(on_success=("cb", "parent ok"), on_complete=("cb", "parent"))
        first = await parent.add("a", 1)
        child = await parent.batch(on_success=("cb", "child ok"), description="child")
        await child.add("b", 2)
        await child.add("c", 3)
        await parent.close()
        await wait_events(app, lambda evs: any(e.kind == "acked" and e.job_id == first
                                               for e in evs))
        mid = await parent.status()
        assert (mid["total"], mid["pending"]) == (2, 1)  # the child is one pending member
        await child.close()
        await cbs.wait("on_complete", "on_success")
        while sum(b["kind"] == "on_success" for b in cbs.seen) < 2:
            cbs.changed.clear()
            await asyncio.wait_for(cbs.changed.wait(), 5)
        final, inner = await parent.status(), await child.status()
    ok = [b["input"] for b in cbs.seen if b["kind"] == "on_success"]
    assert sorted(ok) == ["child ok", "parent ok"]
    # the child's success came first: the parent's waited for it
    assert [b["input"] for b in cbs.seen].index("child ok") < \
        [b["input"] for b in cbs.seen].index("parent ok")
    assert (final["total"], final["done"], final["pending"]) == (2, 2, 0)
    assert inner["parent_id"] == parent.id and (inner["total"], inner["done"]) == (2, 2)


async def test_a_child_with_a_dead_member_ends_dead_in_its_parent(mesh):
    app, cbs = app_on(mesh, "solo"), Callbacks()
    declare(app, cbs, fail={7})
    async with app.serving():
        parent = await app.batch(on_success=("cb", "p"), on_complete=("cb", "p"),
                                 on_death=("cb", "p"))
        child = await parent.batch(home="a")  # no callbacks of its own
        await child.add("b", 7)  # dies (max_attempts=1)
        await child.add("c", 8)
        await child.close()
        await parent.close()
        await cbs.wait("on_complete", "on_death")
        status = await parent.status()
    assert cbs.kinds() == ["on_complete", "on_death"]
    assert (status["total"], status["dead"], status["done"]) == (1, 1, 0)


async def test_a_member_opens_a_child_batch_after_close(mesh):
    app, cbs = app_on(mesh, "solo"), Callbacks()
    app.queue("cb")
    app.queue("split")
    app.queue("leaf")

    @app.worker("cb")
    async def callback(body: dict[str, Any]) -> None:
        cbs.add(body)

    @app.worker("split")
    async def split(n: int, ctx: JobContext) -> None:
        child = await ctx.batch.batch(on_complete=("cb", "child"))
        for i in range(n):
            await child.add("leaf", i)
        await child.close()

    @app.worker("leaf")
    async def leaf(i: int) -> None:
        return None

    async with app.serving():
        parent = await app.batch(on_complete=("cb", "parent"))
        await parent.add("split", 3)
        await parent.close()
        await cbs.wait("on_complete")
        while len(cbs.seen) < 2:
            cbs.changed.clear()
            await asyncio.wait_for(cbs.changed.wait(), 5)
        status = await parent.status()
    assert sorted(b["input"] for b in cbs.seen) == ["child", "parent"]
    assert (status["total"], status["done"]) == (2, 2)  # the split job and its child batch


async def test_a_child_whose_home_restarts_mid_batch_ends_once_in_its_parent(mesh):
    """Members end while the child's home is down (their done reports fail, so their acks do,
    and they come back); the restarted home counts them and reports the child to the
    parent once."""
    storage = MemoryStorage(durable=True, shared=True)
    cbs, gate = Callbacks(), asyncio.Event()
    homes = Istos(storage, transport=mesh.transport("home"), request_timeout_s=0.5)
    homes.queue("home")
    other = Istos(storage, transport=mesh.transport("other"), request_timeout_s=0.5)
    declare(other, cbs)
    other.queue("slow", lease_s=1.0, max_attempts=20)

    @other.worker("slow", concurrency=2)
    async def slow(n: int) -> None:
        await gate.wait()

    async with other.serving():
        await homes.start()
        parent = await other.batch(on_success=("cb", "p"), on_complete=("cb", "p"))
        child = await parent.batch(home="home")
        for n in range(2):
            await child.add("slow", n)
        await wait_events(other, lambda evs: sum(e.kind == "claimed" for e in evs) >= 2)
        homes.kill()  # the child's home dies while both members run
        gate.set()
        await wait_events(other, lambda evs: any(e.kind == "lease_expired" for e in evs))
        again = Istos(storage, transport=mesh.transport("home2"), request_timeout_s=0.5)
        again.queue("home")
        await again.start()
        await child.close()
        await parent.close()
        await cbs.wait("on_complete", "on_success", timeout_s=20)
        status, inner = await parent.status(), await child.status()
        await again.stop()
    assert (status["total"], status["done"], status["pending"]) == (1, 1, 0)
    assert (inner["total"], inner["done"]) == (2, 2)
    assert cbs.kinds() == ["on_complete", "on_success"]


async def test_nesting_bad_input(mesh):
    app, cbs = app_on(mesh, "solo"), Callbacks()
    declare(app, cbs)
    async with app.serving():
        with pytest.raises(ConfigError):
            await app.batch(parent="wf:not-a-handle")  # type: ignore[arg-type]
        with pytest.raises(ConfigError):
            await app.batch()  # no callback, no home, no parent
        parent = await app.batch(on_complete=("cb", 1))
        await parent.close()
        with pytest.raises(InvalidJob):  # a finished parent takes no child
            await parent.batch(on_complete=("cb", 2))
        forged = {"id": parent.id, "home": "cb", "key": "ab" * 16}
        with pytest.raises(InvalidJob):
            await app.client("cb").call("batch_open", batch_id=bs.batch_id("cd" * 16, "cb"),
                                        key="cd" * 16, callbacks={}, parent_batch=forged)


async def test_pruning_looks_at_the_oldest_finished_batches_only(mesh):
    clock = ManualClock()
    app, cbs = app_on(mesh, "solo", clock=clock), Callbacks()
    declare(app, cbs)
    async with app.serving():
        old = [await app.batch(on_complete=("cb", i)) for i in range(3)]
        for b in old:
            await b.close()  # empty: finished at once
        ext = app.batches._owners["cb"]
        assert {bid for _, bid in ext._finished} == {b.id for b in old}
        clock.advance(TOMBSTONE_TTL_S + 1)
        fresh = await app.batch(on_complete=("cb", "new"))  # batch_open prunes the old ones
        assert set(ext.open) == {fresh.id} and not ext._finished
