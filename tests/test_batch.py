"""Batches on the in-process mesh: counts, callbacks once each, adds from members, bad input."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import app_on, count, wait_events

from istos import ConfigError, InvalidJob, Istos, JobContext, JobNotFound, MemoryStorage
from istos.core import batch_state as bs
from istos.features.batch import Batch, BatchAddFailed

pytestmark = pytest.mark.fast  # `make check`: no process, server or session


class Callbacks:
    """Callback jobs seen, by kind (each must come once)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.changed = asyncio.Event()

    def add(self, body: dict[str, Any]) -> None:
        self.seen.append(body)
        self.changed.set()

    def kinds(self) -> list[str]:
        return sorted(b["kind"] for b in self.seen)

    async def wait(self, *kinds: str, timeout_s: float = 5.0) -> None:
        async def until() -> None:
            while not set(kinds) <= {b["kind"] for b in self.seen}:
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(until(), timeout_s)


def declare(app: Istos, cbs: Callbacks, fail: set[int] | None = None) -> None:
    app.queue("cb")
    for q in ("a", "b", "c"):
        app.queue(q, max_attempts=1)

    @app.worker("cb")
    async def callback(body):
        cbs.add(body)

    for q in ("a", "b", "c"):
        @app.worker(q)
        async def member(n):
            if fail and n in fail:
                raise RuntimeError(f"member {n} fails")
            return n


async def test_batch_across_queues_fires_complete_and_success_once(mesh):
    app, cbs = app_on(mesh, "solo"), Callbacks()
    declare(app, cbs)
    async with app.serving():
        batch = await app.batch(on_success=("cb", "ok"), on_complete=("cb", "all"),
                                on_death=("cb", "dead"), description="nightly")
        assert batch.home == "cb" and bs.home_of(batch.id) == "cb"
        for n in range(9):
            await batch.add("abc"[n % 3], n)
        await batch.close()
        await cbs.wait("on_complete", "on_success")
        status = await app.batch_status(batch.id)
    assert cbs.kinds() == ["on_complete", "on_success"]
    success = next(b for b in cbs.seen if b["kind"] == "on_success")
    assert success["input"] == "ok" and success["batch_id"] == batch.id
    assert (success["total"], success["done"], success["dead"]) == (9, 9, 0)
    assert status["closed"] and status["total"] == 9 and status["pending"] == 0
    assert status["callbacks"]["on_death"]["fired_at"] is None
    assert status["callbacks"]["on_success"]["fired_at"] is not None
    assert status["description"] == "nightly"


async def test_a_dead_member_fires_death_and_complete_not_success(mesh):
    app, cbs = app_on(mesh, "solo"), Callbacks()
    declare(app, cbs, fail={2})
    async with app.serving():
        batch = await app.batch(on_success=("cb", None), on_complete=("cb", None),
                                on_death=("cb", None))
        for n in range(4):
            await batch.add("a", n)
        await batch.close()
        await cbs.wait("on_complete", "on_death")
        status = await batch.status()
    assert cbs.kinds() == ["on_complete", "on_death"]
    assert (status["done"], status["dead"], status["pending"]) == (3, 1, 0)


async def test_members_add_members_after_close_and_callbacks_wait_for_them(mesh):
    app, cbs = app_on(mesh, "solo"), Callbacks()
    app.queue("cb")
    app.queue("crawl")

    @app.worker("cb")
    async def callback(body):
        cbs.add(body)

    @app.worker("crawl", concurrency=4)
    async def crawl(depth, ctx: JobContext):
        if depth < 3:
            for _ in range(2):
                await ctx.batch.add("crawl", depth + 1)

    async with app.serving():
        batch = await app.batch(on_complete=("cb", None))
        await batch.add("crawl", 0)
        await batch.close()
        await cbs.wait("on_complete")
        with pytest.raises(InvalidJob, match="closed"):
            await batch.add("crawl", 9)  # from outside, after close
    assert [b["total"] for b in cbs.seen] == [1 + 2 + 4 + 8]
    assert cbs.seen[0]["done"] == 15


async def test_empty_closed_batch_completes_at_once(mesh):
    app, cbs = app_on(mesh, "solo"), Callbacks()
    declare(app, cbs)
    async with app.serving():
        batch = await app.batch(on_complete=("cb", 1), on_success=("cb", 2))
        await batch.close()
        await batch.close()  # idempotent
        await cbs.wait("on_complete", "on_success")
    assert cbs.kinds() == ["on_complete", "on_success"]


async def test_adding_the_same_job_id_twice_counts_once(mesh):
    app, cbs = app_on(mesh, "solo"), Callbacks()
    declare(app, cbs)
    async with app.serving():
        batch = await app.batch(on_success=("cb", None))
        assert await batch.add("a", 1, job_id="x1") == "x1"
        assert await batch.add("a", 1, job_id="x1") == "x1"
        await batch.close()
        await cbs.wait("on_success")
    assert cbs.seen[0]["total"] == 1


async def test_callback_on_another_queue_owner_and_members_on_a_third(mesh):
    home, other, cbs = app_on(mesh, "home"), app_on(mesh, "other"), Callbacks()
    home.queue("h")
    other.queue("cb")
    other.queue("work")

    @other.worker("cb")
    async def callback(body):
        cbs.add(body)

    @home.worker("work")
    async def member(n):
        return n

    async with home.serving(), other.serving():
        batch = await home.batch(home="h", on_success=("cb", "x"))
        for n in range(5):
            await batch.add("work", n)
        await batch.close()
        await cbs.wait("on_success")
    assert cbs.seen[0]["done"] == 5


async def test_bad_input_is_refused_with_typed_errors(mesh):
    app, cbs = app_on(mesh, "solo"), Callbacks()
    declare(app, cbs)
    async with app.serving():
        with pytest.raises(ConfigError, match="callback or a home"):
            await app.batch()
        with pytest.raises(ConfigError, match="pair"):
            await app.batch(on_success="cb")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="not a batch id"):
            await app.batch_status("nope")
        with pytest.raises(JobNotFound):
            await app.batch_status(bs.batch_id("0" * 32, "cb"))
        batch = await app.batch(on_success=("cb", None))
        # A producer that only read the id cannot add, report or forge a callback.
        forged = {"id": batch.id, "home": "cb", "key": "f" * 32}
        with pytest.raises(InvalidJob, match="not the id of a batch"):
            await app.producer.enqueue("a", 1, _meta={"batch": forged})
        with pytest.raises(InvalidJob):
            await app.client("cb").call("batch_report", batch_id=batch.id, key="f" * 32,
                                        member="m", outcome="done")
        with pytest.raises(InvalidJob):
            await app.producer.enqueue("cb", 1, job_id=f"{batch.id}.on_success", _meta={
                "batch_cb": {**forged, "kind": "on_success"}})
        await batch.close()
        await cbs.wait("on_success")
        with pytest.raises(InvalidJob, match="closed"):
            await batch.add("a", 1)


async def test_add_whose_enqueue_fails_names_the_job_id_to_retry(mesh):
    app, cbs = app_on(mesh, "solo"), Callbacks()
    declare(app, cbs)
    async with app.serving():
        batch = await app.batch(on_success=("cb", None))
        with pytest.raises(BatchAddFailed) as err:
            await batch.add("nobody-serves-this", 1, timeout_s=0.2)
        assert (await batch.status())["pending"] == 1
        # Defined outcome: the member stays pending until added again (here on a real queue).
        await batch.add("a", 1, job_id=err.value.job_id)
        await batch.close()
        await asyncio.sleep(0)
        assert (await batch.status())["pending"] == 1  # the first queue never got it


async def test_counts_and_fired_callbacks_survive_a_home_restart(mesh):
    storage, cbs = MemoryStorage(durable=True), Callbacks()
    app = app_on(mesh, "home", storage=storage)
    app.queue("cb")
    app.queue("a")
    async with app.serving():
        batch = await app.batch(on_success=("cb", None), on_complete=("cb", None))
        for n in range(3):
            await batch.add("a", n)
    again = app_on(mesh, "home2", storage=storage)
    declare_again(again, cbs)
    async with again.serving():
        before = await again.batch_status(batch.id)
        assert (before["total"], before["pending"]) == (3, 3)
        # The creator's handle, on another node after the restart (the id and key survive).
        await Batch(batch.id, batch.home, batch._key, again.batches).close()
        await cbs.wait("on_success", "on_complete")
    assert cbs.kinds() == ["on_complete", "on_success"]


def declare_again(app: Istos, cbs: Callbacks) -> None:
    app.queue("cb")
    app.queue("a")

    @app.worker("cb")
    async def callback(body):
        cbs.add(body)

    @app.worker("a")
    async def member(n):
        return n


def test_header_moves_and_due_callbacks():
    h = bs.BatchHeader({"on_success": ("q", b""), "on_complete": ("q", b""),
                        "on_death": ("q", b"")})
    assert h.apply(None, bs.PENDING) and h.apply(None, bs.PENDING)
    assert h.due() == []  # open
    h.closed = True
    assert h.apply(bs.PENDING, bs.DEAD) and not h.apply(bs.PENDING, bs.PENDING)
    assert h.due() == ["on_death"]
    assert not h.apply(bs.DEAD, bs.CANCELLED)  # not a move
    assert h.apply(bs.PENDING, bs.DONE)
    assert h.due() == ["on_death", "on_complete"]
    assert h.apply(bs.DEAD, bs.DONE)  # requeued and then done
    assert not h.apply(bs.DONE, bs.DEAD) and not h.apply(bs.DONE, bs.CANCELLED)  # final
    assert h.due() == ["on_complete", "on_success"]  # nobody is dead any more
    assert bs.BatchHeader.decode(h.encode()) == h


async def test_ten_thousand_members_on_two_queues_complete_once(mesh):
    app, cbs = app_on(mesh, "solo"), Callbacks()
    app.queue("cb")
    app.queue("a")
    app.queue("b")
    ran: set[str] = set()

    @app.worker("cb")
    async def callback(body):
        cbs.add(body)

    for q in ("a", "b"):
        @app.worker(q, concurrency=16)
        async def member(n, ctx: JobContext):
            ran.add(ctx.job_id)

    async with app.serving():
        batch = await app.batch(on_complete=("cb", None), on_success=("cb", None))
        for n in range(10_000):
            await batch.add("ab"[n % 2], n)
        await batch.close()
        await cbs.wait("on_complete", "on_success", timeout_s=60)
    assert len(ran) == 10_000
    assert cbs.kinds() == ["on_complete", "on_success"]
    assert all(b["done"] == 10_000 for b in cbs.seen)


async def test_a_death_while_the_home_is_down_is_reported_once_it_is_back(mesh):
    storage, cbs = MemoryStorage(durable=True), Callbacks()
    home = app_on(mesh, "home", storage=storage)
    member = app_on(mesh, "member", request_timeout_s=0.3)
    home.queue("cb")
    member.queue("a", max_attempts=1)
    go = asyncio.Event()

    @member.worker("a")
    async def fails(n):
        await go.wait()
        raise RuntimeError("no")

    async with member.serving():
        async with home.serving():
            batch = await home.batch(on_death=("cb", None), on_complete=("cb", None))
            await batch.add("a", 1)
            await batch.close()
        go.set()  # dies while the home is down: its report waits and is retried
        await wait_events(member, lambda evs: count(evs, "dead_lettered") == 1)
        again = app_on(mesh, "home2", storage=storage)
        again.queue("cb")

        @again.worker("cb")
        async def callback(body):
            cbs.add(body)

        async with again.serving():
            await cbs.wait("on_death", "on_complete", timeout_s=15)
    assert cbs.kinds() == ["on_complete", "on_death"]
    assert all(b["dead"] == 1 for b in cbs.seen)
