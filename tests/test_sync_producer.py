"""istos.SyncProducer over real Zenoh: blocking calls from threads with no event loop, and from
the thread of a loop that itself runs the queue's owner (a notebook kernel's case)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from helpers import count, wait_events
from zenoh_util import isolated_configs, unique_prefix

from istos import (
    ConfigError,
    InvalidJob,
    Istos,
    IstosError,
    MemoryStorage,
    OwnerUnavailable,
    SyncProducer,
)
from istos.core.records import READY


async def test_enqueue_result_and_dead_letters_from_a_thread_without_a_loop():
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q", keep_results=True)
    owner.queue("bad", max_attempts=1)
    worker = Istos(zenoh=configs[1], prefix=prefix, node_id="w")

    @worker.worker("q", concurrency=2)
    async def double(x: int) -> int:
        return 2 * x

    @worker.worker("bad")
    async def fail(x: Any) -> None:
        raise RuntimeError(f"no {x}")

    def produce() -> dict[str, Any]:
        with pytest.raises(RuntimeError):
            asyncio.get_running_loop()  # really no loop on this thread
        with SyncProducer(configs[2], prefix=prefix, request_timeout_s=20) as sp:
            one = sp.enqueue("q", 21, job_id="one")
            assert sp.enqueue("q", 99, job_id="one") == "one"  # idempotent by id
            many = sp.enqueue_many("q", list(range(5000)))  # two enqueue_many frames
            dead_id = sp.enqueue("bad", "x")
            sp.enqueue("q", 50, job_id="child", after=[one])  # waits for "one" (a parent ref)
            return {"sp": sp, "one": one, "many": many, "dead": dead_id}

    async with owner.serving(), worker.serving():
        got = await asyncio.to_thread(produce)
        assert got["one"] == "one" and len(set(got["many"])) == 5000
        await wait_events(owner, lambda ev: count(ev, "acked") == 5002
                          and count(ev, "dead_lettered") == 1, timeout_s=60)

        def ask() -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
            with SyncProducer(configs[2], prefix=prefix, request_timeout_s=20) as sp:
                return sp.result("q", "one"), sp.dead_letters("bad"), sp.result("q", "child")

        result, dead, child = await asyncio.to_thread(ask)
    assert result == {"state": "done", "result": 42}
    assert child == {"state": "done", "result": 100}
    assert [d["job_id"] for d in dead] == [got["dead"]]
    assert dead[0]["data"] == "x" and "no x" in dead[0]["last_error"]
    with pytest.raises(IstosError, match="closed"):
        got["sp"].enqueue("q", 1)


async def test_many_threads_share_one_producer():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    ids: list[str] = []
    lock = threading.Lock()
    async with owner.serving():
        with SyncProducer(configs[1], prefix=prefix, request_timeout_s=20) as sp:
            def produce(t: int) -> None:
                mine = [sp.enqueue("q", {"t": t, "i": i}) for i in range(50)]
                with lock:
                    ids.extend(mine)

            await asyncio.gather(*(asyncio.to_thread(produce, t) for t in range(4)))
        state = owner.owners["q"].state
        assert len(set(ids)) == 200 and state.counts[READY] == 200


async def test_a_blocking_call_on_the_loop_that_runs_the_owner_does_not_deadlock():
    """What a notebook cell does: sync code on the thread whose loop serves the owner."""
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q", keep_results=True)
    async with owner.serving():
        with SyncProducer(configs[1], prefix=prefix, request_timeout_s=5) as sp:
            jid = sp.enqueue("q", "hi")  # blocking, on this loop's thread: answered in-process
            ids = sp.enqueue_many("q", [1, 2, 3])
            assert sp.result("q", jid)["state"] == "ready"
            assert sp.dead_letters("q") == []
        assert owner.owners["q"].state.counts[READY] == 4 and len(ids) == 3


async def test_a_blocking_call_on_the_loop_of_a_durable_owner_refuses_at_once():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(storage=MemoryStorage(durable=True), zenoh=configs[0], prefix=prefix)
    owner.queue("q")
    async with owner.serving():
        with SyncProducer(configs[1], prefix=prefix, request_timeout_s=5) as sp:
            with pytest.raises(ConfigError, match="another thread"):
                sp.enqueue("q", "hi")
            # ...and from another thread the same call goes over the mesh and succeeds.
            jid = await asyncio.to_thread(sp.enqueue, "q", "hi")
        assert owner.owners["q"].state.jobs[jid].state == READY


async def test_no_owner_bad_input_and_bad_options():
    configs, prefix = isolated_configs(1), unique_prefix()
    with pytest.raises(ConfigError, match="request_timeout_s"):
        SyncProducer(configs[0], request_timeout_s=0)

    def calls() -> None:
        with SyncProducer(configs[0], prefix=prefix, request_timeout_s=0.3) as sp:
            with pytest.raises(InvalidJob):
                sp.enqueue("q", object())  # refused before anything is sent
            with pytest.raises(ConfigError):
                sp.enqueue("q", 1, job_id="")
            with pytest.raises(OwnerUnavailable, match="no owner of queue 'q'"):
                sp.enqueue("q", 1)

    await asyncio.to_thread(calls)
