"""Firing a batch's callbacks: decided under the batch's lock, sent with the lock released, a
decision stored before a crash sent at restart, once; and a member counted done stays done."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from helpers import app_on, count, wait_events
from test_batch import Callbacks, declare_again

from istos import JobContext, MemoryStorage
from istos.core import batch_state as bs

pytestmark = pytest.mark.fast  # `make check`: no process, server or session


async def test_the_batch_lock_is_free_and_the_decision_stored_while_a_callback_goes_out(mesh):
    storage, cbs = MemoryStorage(durable=True), Callbacks()
    app = app_on(mesh, "home", storage=storage)
    declare_again(app, cbs)
    seen: list[tuple[bool, dict[str, Any]]] = []
    async with app.serving():
        batch = await app.batch(on_complete=("cb", None))
        ext = app.batches._owners["cb"]
        inner = ext._fire

        async def fire(queue: str, body: Any, **kw: Any) -> str:
            held = batch.id in ext._locks and ext._locks[batch.id][0].locked()
            raw = await storage.get(f"batch:cb:{batch.id}", "h")
            assert raw is not None
            seen.append((held, msgpack.unpackb(raw)["firing"]))
            return await inner(queue, body, **kw)

        ext._fire = fire
        await batch.add("a", 1)
        await batch.close()
        await cbs.wait("on_complete")
        status = await batch.status()
    assert seen == [(False, {"on_complete": {"total": 1, "pending": 0, "done": 1, "dead": 0,
                                             "cancelled": 0}})]
    assert cbs.kinds() == ["on_complete"]
    assert status["callbacks"]["on_complete"]["fired_at"] is not None
    header = bs.BatchHeader.decode(msgpack.unpackb(await storage.get(
        f"batch:cb:{batch.id}", "h"), raw=False))
    assert header.firing == {} and not header.owes_work()


async def test_a_decision_stored_before_a_crash_is_sent_at_restart_once(mesh):
    storage, cbs = MemoryStorage(durable=True), Callbacks()
    first = app_on(mesh, "home", storage=storage)
    declare_again(first, Callbacks())
    async with first.serving():
        batch = await first.batch(on_complete=("cb", "x"), on_success=("cb", "y"))
    # The crash: the home stored its decision to fire on_complete (with the counts it
    # carries), and died before the enqueue went out.
    ns = f"batch:cb:{batch.id}"
    raw = await storage.get(ns, "h")
    assert raw is not None
    header = bs.BatchHeader.decode(msgpack.unpackb(raw, raw=False))
    header.closed, header.finished_at = True, 1.0
    header.firing = {"on_complete": header.counts(), "on_success": header.counts()}
    await storage.put(ns, "h", msgpack.packb(header.encode(), use_bin_type=True))
    again = app_on(mesh, "home2", storage=storage)
    declare_again(again, cbs)
    async with again.serving():
        await cbs.wait("on_complete", "on_success", timeout_s=10)
        status = await again.batch_status(batch.id)
        # A repeat of the firing (as a second sender would make) is dropped by the job id.
        ext = again.batches._owners["cb"]
        raw = await storage.get(ns, "h")
        assert raw is not None
        stale = bs.BatchHeader.decode(msgpack.unpackb(raw, raw=False))
        stale.fired.pop("on_success")
        stale.firing["on_success"] = stale.counts()
        ext.open[batch.id] = stale
        await ext._fire_due(batch.id, batch._key)  # returns once the callback queue answered
        made = [e for e in again.events.recent()
                if e.kind == "enqueued" and e.job_id == bs.callback_job_id(batch.id,
                                                                              "on_success")]
        assert len(made) == 1
    assert cbs.kinds() == ["on_complete", "on_success"]
    assert {b["input"] for b in cbs.seen} == {"x", "y"}
    assert all(b["total"] == 0 for b in cbs.seen)
    assert all(status["callbacks"][k]["fired_at"] is not None
               for k in ("on_complete", "on_success"))


async def test_a_member_counted_done_stays_done_when_a_later_run_dies(mesh):
    """The race: the done report is counted, the ack comes too late (the lease ran out while
    the home was slow to answer, and the job ran again and died meanwhile). done is final at
    the home: on_success fired once, on_death never, and a kept_done event says why."""
    cbs, runs = Callbacks(), []
    home = app_on(mesh, "home")
    member = app_on(mesh, "member")
    home.queue("cb")
    member.queue("a", lease_s=0.3, max_attempts=2, retry_backoff_s=0.01, retry_jitter=0.0)

    @home.worker("cb")
    async def callback(body):
        cbs.add(body)

    @member.worker("a", concurrency=2)
    async def work(n, ctx: JobContext):
        runs.append(ctx.attempt)
        if len(runs) > 1:
            raise RuntimeError("the second run dies")

    async with home.serving(), member.serving():
        ext = member.batches._owners["a"]
        inner = ext._call
        slow_once = [True]

        async def call(queue: str, op: str, **fields: Any) -> dict[str, Any]:
            reply = await inner(queue, op, **fields)
            if op == "batch_report" and fields["outcome"] == "done" and slow_once.pop():
                # Counted at the home; its answer comes back late: the lease ran out, the
                # job ran again and died meanwhile, so this run's ack is refused as stale.
                await wait_events(member, lambda evs: count(evs, "dead_lettered") == 1)
            return reply

        ext._call = call
        batch = await home.batch(on_success=("cb", None), on_complete=("cb", None),
                                 on_death=("cb", None))
        job_id = await batch.add("a", 1)
        await batch.close()
        await cbs.wait("on_success", "on_complete")
        await wait_events(member, lambda evs: count(evs, "dead_lettered") == 1)
        kept = await wait_events(home, lambda evs: any(
            e.kind == "batch" and e.detail.get("change") == "kept_done" for e in evs))
        status = await batch.status()
        again = await home.batches.client("cb").call(
            "batch_report", batch_id=batch.id, key=batch._key, member=job_id, outcome="dead")
    assert len(runs) == 2
    event = next(e for e in kept if e.kind == "batch" and e.detail.get("change") == "kept_done")
    assert (event.detail["member"], event.detail["reported"]) == (job_id, "dead")
    assert (status["done"], status["dead"], status["pending"]) == (1, 0, 0)
    assert status["callbacks"]["on_death"]["fired_at"] is None
    assert again["status"] == "repeat"
    assert cbs.kinds() == ["on_complete", "on_success"]
