"""Firing a batch's callbacks: decided under the batch's lock, sent with the lock released, and
a decision stored before a crash sent at restart, once."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from helpers import app_on
from test_batch import Callbacks, declare_again

from istos import MemoryStorage
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
