"""app.enqueue_many (issue 18): a remote owner over real Zenoh accepts batches, one request per
frame, idempotent per job id, all or nothing per request on storage failure.

The outage test runs its own redis-server (never the shared one) and SIGKILLs it.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from services import free_port, start_throwaway_redis
from zenoh_util import isolated_configs, unique_prefix

from istos import InvalidJob, Istos, RedisStoragePlugin, StorageUnavailable, codec, protocol
from istos.client import batches


@asynccontextmanager
async def owner_and_producer(storage: Any = None) -> AsyncIterator[tuple[Istos, Istos]]:
    cfg_owner, cfg_producer = isolated_configs(2)
    prefix = unique_prefix()
    owner = Istos(storage=storage, zenoh=cfg_owner, prefix=prefix, node_id="owner")
    owner.queue("q", max_attempts=1)
    producer = Istos(zenoh=cfg_producer, prefix=prefix, node_id="producer",
                     request_timeout_s=10.0)
    async with owner.serving(), producer.serving():
        yield owner, producer


def count_requests(owner: Istos) -> list[int]:
    """Wrap the owner's enqueue_many op to count the requests (and items) it serves."""
    return count_ops(owner, "enqueue_many")["enqueue_many"]


async def test_ids_in_order_and_every_job_queued_once():
    async with owner_and_producer() as (owner, producer):
        served = count_requests(owner)
        ids = await producer.enqueue_many("q", [{"n": i} for i in range(500)], priority=3)
        assert len(ids) == 500 and len(set(ids)) == 500
        state = owner.owners["q"].state
        assert [state.jobs[j].priority for j in ids] == [3] * 500
        assert served == [500]  # one round trip for the whole batch
        mine = await producer.enqueue_many("q", ["a", "b"], job_ids=["x1", "x2"], delay_s=60)
        assert mine == ["x1", "x2"] and state.jobs["x1"].state == "delayed"
        assert (await producer.result("q", ids[0]))["state"] == "ready"


async def test_a_retried_batch_adds_nothing_twice():
    async with owner_and_producer() as (owner, producer):
        ids = [f"job-{i}" for i in range(50)]
        await producer.enqueue_many("q", list(range(50)), job_ids=ids)
        again = await producer.enqueue_many("q", list(range(60)),
                                            job_ids=ids + [f"new-{i}" for i in range(10)])
        assert again[:50] == ids
        state = owner.owners["q"].state
        assert len(state.jobs) == 60 and state.counts["ready"] == 60
        reply = await producer.client("q").call("enqueue_many", items=[
            {"body": b"\x01", "job_id": "dup"}, {"body": b"\x02", "job_id": "dup"},
            {"body": b"\x03", "job_id": "job-0"}])
        assert reply["created"] == [True, False, False]
        assert state.jobs["dup"].body == b"\x01" and len(state.jobs) == 61


async def test_mixed_sizes_are_split_into_frames_under_the_cap():
    big = "x" * 600_000
    items: list[Any] = [big, {"n": 1}, big, big] + [{"n": i} for i in range(5000)]
    async with owner_and_producer() as (owner, producer):
        served = count_requests(owner)
        ids = await producer.enqueue_many("q", items)
        assert sum(served) == len(items) and len(served) >= 4
        assert all(n <= protocol.MAX_ENQUEUE_ITEMS for n in served)
        state = owner.owners["q"].state
        assert len(state.jobs) == len(items)
        assert len(state.jobs[ids[2]].body) > 600_000 and len(state.jobs[ids[1]].body) < 100
    frames = batches.frames(ids, [codec.encode_body(x) for x in items], 0, 0)
    assert [len(f) for f in frames] == served
    assert all(protocol.encoded_size({"v": 1, "op": "enqueue_many", "items": f})
               <= protocol.FRAME_CAP for f in frames)


async def test_a_bad_item_refuses_the_batch_before_anything_is_sent():
    async with owner_and_producer() as (owner, producer):
        served = count_requests(owner)
        with pytest.raises(InvalidJob, match="item 2"):
            await producer.enqueue_many("q", [1, 2, object(), 4])
        with pytest.raises(InvalidJob, match="item 1.*limit"):
            await producer.enqueue_many("q", [1, "z" * (protocol.MAX_BODY_BYTES + 1)])
        with pytest.raises(InvalidJob, match=r"job_ids\[1\]"):
            await producer.enqueue_many("q", [1, 2], job_ids=["ok", "bad\x00id"])
        assert served == [] and owner.owners["q"].state.jobs == {}
        # A hand-made request with one bad item is refused whole by the owner's schema.
        reply = await producer.node.transport.query(  # type: ignore[union-attr]
            producer.node.key("q", "rpc/produce"), _raw_batch(), 5.0)
        answer = codec.decode_message(reply)
        assert answer["ok"] is False and answer["error"] == "InvalidJob", answer
        assert "items[1]" in answer["message"] and owner.owners["q"].state.jobs == {}


def _raw_batch() -> bytes:
    return codec.encode_message({"v": 1, "op": "enqueue_many", "items": [
        {"body": b"\x01", "job_id": "fine"}, {"body": b"\x02", "job_id": "x", "priority": "9"}]})


# -- storage outage ---------------------------------------------------------------------------
class PrivateRedis:
    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.dir = str(data_dir)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = start_throwaway_redis(self.port, self.dir)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def storage(self) -> RedisStoragePlugin:
        return RedisStoragePlugin(f"redis://127.0.0.1:{self.port}/0", key_prefix="t",
                                  connect_timeout_s=0.3, op_timeout_s=0.3)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.kill()


async def test_storage_outage_refuses_the_whole_batch(redis_server):
    async with owner_and_producer(redis_server.storage()) as (owner, producer):
        ids = await producer.enqueue_many("q", [1, 2, 3])
        redis_server.kill()
        with pytest.raises(StorageUnavailable):
            await producer.enqueue_many("q", list(range(100)),
                                        job_ids=[f"out-{i}" for i in range(100)])
        state = owner.owners["q"].state
        assert set(state.jobs) == set(ids)  # nothing of the refused batch in memory
        redis_server.start()
        probe = redis_server.storage()
        try:
            stored = {k for k, _ in await probe.scan("jobs:q")}
        finally:
            await probe.close()
        assert stored == set(ids)  # ...nor in storage
        again = await producer.enqueue_many("q", list(range(100)),
                                            job_ids=[f"out-{i}" for i in range(100)])
        assert len(again) == 100 and len(state.jobs) == 103


# -- concurrent enqueues coalesce ---------------------------------------------------------------
def count_ops(owner: Istos, *ops: str) -> dict[str, list[int]]:
    """Requests the owner serves per op (the item count of each enqueue_many)."""
    served: dict[str, list[int]] = {op: [] for op in ops}
    q = owner.owners["q"]
    # Both tables dispatch serves from: requests with meta (_ops) and without (_plain_ops).
    for table, op in ((t, op) for t in (q._ops, q._plain_ops) for op in ops):
        inner = table[op]

        async def counting(msg: dict[str, Any], _op: str = op, _inner: Any = inner
                           ) -> dict[str, Any]:
            served[_op].append(len(msg.get("items", [msg])))
            return await _inner(msg)

        table[op] = counting
    return served


async def test_concurrent_enqueues_to_a_remote_owner_share_one_request():
    async with owner_and_producer() as (owner, producer):
        served = count_ops(owner, "enqueue", "enqueue_many")
        lone = await producer.enqueue("q", {"alone": True})
        assert served == {"enqueue": [1], "enqueue_many": []}  # a lone call: a plain enqueue
        ids = await asyncio.gather(*(producer.enqueue("q", i, priority=i % 3)
                                     for i in range(300)))
        # The turn's first call goes out at once; the 299 made after it in that turn, together.
        assert served["enqueue_many"] == [299] and served["enqueue"] == [1, 1]
        state = owner.owners["q"].state
        assert len(set(ids)) == 300 and set(state.jobs) == {lone, *ids}
        assert [state.jobs[j].priority for j in ids] == [i % 3 for i in range(300)]
        # Caller-chosen ids stay idempotent when coalesced: a repeat adds nothing.
        again = await asyncio.gather(*(producer.enqueue("q", 0, job_id=j) for j in ids[:10]))
        assert again == ids[:10] and len(state.jobs) == 301


async def test_sequential_enqueues_each_go_alone_and_a_call_made_meanwhile_joins_a_batch():
    async with owner_and_producer() as (owner, producer):
        served = count_ops(owner, "enqueue", "enqueue_many")
        for i in range(5):  # one request in flight at a time: each a plain enqueue, at once
            await producer.enqueue("q", i)
        assert served == {"enqueue": [1] * 5, "enqueue_many": []}
        coalescer = producer.client("q")._coalescer
        assert coalescer is not None and coalescer._open is None  # nothing left open
        first = asyncio.ensure_future(producer.enqueue("q", "first"))
        await asyncio.sleep(0)  # the first call is out, awaiting its reply
        later = [asyncio.ensure_future(producer.enqueue("q", n)) for n in range(3)]
        ids = await asyncio.gather(first, *later)
        assert served["enqueue"] == [1] * 6 and served["enqueue_many"] == [3]
        assert set(ids) <= set(owner.owners["q"].state.jobs) and coalescer._open is None


async def test_an_owner_without_enqueue_many_gets_them_one_by_one():
    async with owner_and_producer() as (owner, producer):
        del owner.owners["q"]._ops["enqueue_many"]  # as an owner from before the op answers
        ids = await asyncio.gather(*(producer.enqueue("q", i) for i in range(20)))
        assert set(owner.owners["q"].state.jobs) == set(ids) and len(set(ids)) == 20


async def test_coalesced_callers_all_fail_on_an_outage_and_nothing_is_stored(redis_server):
    async with owner_and_producer(redis_server.storage()) as (owner, producer):
        redis_server.kill()
        calls = [producer.enqueue("q", i, job_id=f"c{i}") for i in range(30)]
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, StorageUnavailable) for r in results), results
        assert len({id(r) for r in results}) == 30  # each caller its own error
        assert owner.owners["q"].state.jobs == {}
        redis_server.start()
        assert await asyncio.gather(*(producer.enqueue("q", i, job_id=f"c{i}")
                                      for i in range(30))) == [f"c{i}" for i in range(30)]


async def test_enqueue_many_to_the_owner_in_this_process():
    cfg = isolated_configs(1)[0]
    app = Istos(zenoh=cfg, prefix=unique_prefix())
    app.queue("q")
    async with app.serving():
        ids = await app.enqueue_many("q", [{"n": i} for i in range(10)], priority=1)
        again = await app.enqueue_many("q", [0] * 10, job_ids=ids)
        state = app.owners["q"].state
        assert again == ids and len(state.jobs) == 10 and state.counts["ready"] == 10
