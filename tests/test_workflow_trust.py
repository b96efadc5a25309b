"""Workflows a producer cannot hijack (issue 23, attacks 1-4), on real Zenoh.

The attacker holds what a producer holds: it sends to ``rpc/produce`` and ``rpc/read`` keys
by hand and reads everything those show. The legitimate chain and chord must complete with
their own data while every attack fails with a typed error and changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from test_wire_trust import Raw, refused
from zenoh_util import isolated_configs, unique_prefix

from istos import Istos, codec
from istos.core import workflow_meta as wf
from istos.transport.zenoh import ZenohTransport


@dataclass
class Mesh:
    owner: Istos
    producer: Istos
    raw: Raw
    release: asyncio.Event = field(default_factory=asyncio.Event)
    held: asyncio.Event = field(default_factory=asyncio.Event)
    seen: dict[str, list[Any]] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    async def count(self, queue: str, state: str) -> int:
        stats = await self.raw.op(queue, "read", "stats")
        return int(stats["stats"]["counts"][state])


@asynccontextmanager
async def mesh() -> AsyncIterator[Mesh]:
    configs, prefix = isolated_configs(4), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    for name in ("s1", "s2", "s3", "evil", "shard", "cb", "victim"):
        owner.queue(name)
    worker = Istos(zenoh=configs[1], prefix=prefix, node_id="worker")
    producer = Istos(zenoh=configs[2], prefix=prefix, node_id="producer")
    transport = ZenohTransport(configs[3], node_id="attacker")
    m = Mesh(owner, producer, Raw(transport, prefix))

    def record(queue: str, data: Any) -> None:
        m.seen.setdefault(queue, []).append(data)
        if queue in ("s3", "cb", "victim"):
            m.done.set()

    @worker.worker("s1", poll_interval_s=0.1)
    async def step1(data: Any) -> Any:
        m.held.set()
        await m.release.wait()
        record("s1", data)
        return {"after": "s1", "was": data}

    @worker.worker("s2", poll_interval_s=0.1)
    async def step2(data: Any) -> Any:
        record("s2", data)
        return {"after": "s2", "was": data}

    @worker.worker("shard", concurrency=4, poll_interval_s=0.1)
    async def member(data: Any) -> Any:
        m.held.set()
        await m.release.wait()
        record("shard", data)
        return data * 10

    for name in ("s3", "evil", "cb", "victim"):
        @worker.worker(name, poll_interval_s=0.1)
        async def last(data: Any, _name: str = name) -> None:
            record(_name, data)

    async with owner.serving(), worker.serving(), producer.serving():
        await transport.start()
        try:
            yield m
        finally:
            await transport.close()


async def first_job(m: Mesh, queue: str, state: str = "leased") -> str:
    await asyncio.wait_for(m.held.wait(), 30)
    jobs = await m.raw.op(queue, "read", "jobs", state=state)
    [job] = jobs["jobs"]
    assert "meta" not in job  # reads never show a workflow's meta (nor its key)
    return str(job["job_id"])


async def finish(m: Mesh) -> None:
    m.release.set()
    await asyncio.wait_for(m.done.wait(), 30)
    await asyncio.sleep(0)  # (the recording worker has returned)


async def test_attack_1_a_producer_cannot_cut_a_chain_with_its_own_step():
    async with mesh() as m:
        first = await m.producer.chain(["s1", "s2", "s3"], {"from": "producer"})
        assert first.startswith("wf:") and first == await first_job(m, "s1")
        chain = first.rpartition(".")[0]
        forged = codec.encode_body({"from": "attacker"})
        reply = await m.raw.op("s2", "produce", "enqueue", body=forged, job_id=f"{chain}.1")
        refused(reply, "InvalidJob", "wf:")
        reply = await m.raw.op("s2", "produce", "enqueue_many",
                               items=[{"body": forged, "job_id": f"{chain}.1"}])
        refused(reply, "InvalidJob", "items[0]")
        assert await m.count("s2", "ready") == 0 and await m.count("s2", "done") == 0
        await finish(m)
        assert m.seen["s2"] == [{"after": "s1", "was": {"from": "producer"}}]
        assert m.seen["s3"] == [{"after": "s2", "was": m.seen["s2"][0]}]


async def test_attack_2_a_producer_cannot_redirect_a_chain():
    async with mesh() as m:
        await m.producer.chain(["s1", "s2", "s3"], {"from": "producer"})
        chain = (await first_job(m, "s1")).rpartition(".")[0]
        forged = codec.encode_body({"from": "attacker"})
        for key in (None, "0" * 32, m.producer.node.ids.token()):
            step: dict[str, Any] = {"id": chain, "queues": ["s1", "s2", "evil"], "step": 1,
                                    "priority": 0}
            if key is not None:
                step["key"] = key
            reply = await m.raw.op("s2", "produce", "enqueue", body=forged,
                                   job_id=f"{chain}.1", meta={"chain": step})
            refused(reply, "InvalidJob")
        # Its own key gives its own chain id, never this one: redirecting needs the key.
        key = m.producer.node.ids.token()
        assert wf.chain_id(key, ["s1", "s2", "evil"], 0) != chain
        assert await m.count("s2", "ready") == 0
        await finish(m)
        assert "evil" not in m.seen and len(m.seen["s3"]) == 1


async def test_attack_3_a_producer_cannot_pre_empt_a_chords_callback():
    async with mesh() as m:
        chord = await m.producer.chord("shard", [1, 2], callback=("cb", "in"))
        await asyncio.wait_for(m.held.wait(), 30)
        forged = codec.encode_body({"results": ["forged"], "input": "in"})
        for meta in (None, {"callback": {"id": chord, "queue": "shard", "size": 2,
                                         "key": "0" * 32}}):
            reply = await m.raw.op("cb", "produce", "enqueue", body=forged,
                                   job_id=f"{chord}.callback", meta=meta)
            refused(reply, "InvalidJob")
        assert await m.count("cb", "ready") == 0
        await finish(m)
        assert m.seen["cb"] == [{"results": [10, 20], "input": "in"}]


async def test_attack_4_an_owner_fires_no_callback_into_a_queue_that_did_not_expect_it():
    async with mesh() as m:
        key = m.producer.node.ids.token()
        chord = wf.chord_id(key, "shard", 1, "victim")  # its own chord, aimed at "victim"
        reply = await m.raw.op("shard", "produce", "chord_open", chord_id=chord, size=1,
                               callback="victim", key=key)
        refused(reply, "InvalidJob", "reservation")
        meta = {"chord": {"id": chord, "index": 0, "size": 1, "callback": "victim",
                          "input": None, "key": key}}
        reply = await m.raw.op("shard", "produce", "enqueue", body=codec.encode_body(1),
                               job_id=f"{chord}.0", meta=meta)
        refused(reply, "InvalidJob", "holds no open chord")
        # A chord_open whose callback queue differs from the one its id binds is refused too.
        reply = await m.raw.op("shard", "produce", "chord_open", chord_id=chord, size=1,
                               callback="cb", key=key)
        refused(reply, "InvalidJob", "not the id")
        assert await m.count("shard", "ready") == 0
        assert await m.count("victim", "ready") == 0 and "victim" not in m.seen
        # The legitimate path reserves first, on the callback queue's produce key.
        chord = await m.producer.chord("shard", [3], callback=("victim", "ok"))
        await finish(m)
        assert m.seen["victim"] == [{"results": [30], "input": "ok"}]
