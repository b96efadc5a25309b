"""What a client holding the produce (or work) key can make an owner keep or do is bounded, over
real Zenoh: unused chord reservations expire and are capped per queue, ``chord_open`` naming an
unserved callback queue costs a bounded number of outbound queries, and invented worker ids do
not evict a working worker from the ``workers`` table."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from test_wire_trust import Raw, refused
from zenoh_util import isolated_configs, unique_prefix, wait_until

from istos import Istos, codec
from istos.clock import ManualClock
from istos.core import workflow_meta as wf
from istos.features import chord_callbacks
from istos.owner.views.workers import MAX_WORKERS
from istos.transport.zenoh import ZenohTransport

CAP = 48  # the reservation cap, lowered so the test fills it in a few round trips


def key_of(rng: random.Random) -> str:
    return f"{rng.getrandbits(128):032x}"


async def serve(configs: list[dict[str, Any]], prefix: str, app: Istos) -> Raw:
    transport = ZenohTransport(configs[1], node_id="raw")
    await transport.start()
    return Raw(transport, prefix)


async def reserve(raw: Raw, key: str) -> dict[str, Any]:
    chord = wf.chord_id(key, "members", 1, "cb")
    return await raw.op("cb", "produce", "chord_reserve", chord_id=chord,
                        member_queue="members", size=1, key=key)


async def test_unused_chord_reservations_expire_and_are_capped_per_queue(monkeypatch):
    monkeypatch.setattr(chord_callbacks, "MAX_RESERVATIONS", CAP)
    configs, prefix = isolated_configs(2), unique_prefix()
    clock = ManualClock()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner", clock=clock)
    owner.queue("cb")
    rng = random.Random(7)
    async with owner.serving():
        raw = await serve(configs, prefix, owner)
        try:
            keys = [key_of(rng) for _ in range(CAP)]
            replies = await asyncio.gather(*(reserve(raw, k) for k in keys))
            assert all(r["ok"] and r["reserved"] for r in replies), replies[:3]
            assert (await reserve(raw, keys[0]))["reserved"] is False  # a retry: no new one
            over = await reserve(raw, key_of(rng))
            refused(over, "CapacityExceeded", "unused chord reservations", str(CAP))
            first = wf.chord_id(keys[0], "members", 1, "cb")
            expects = await raw.op("cb", "read", "chord_expects", chord_id=first)
            assert expects["reserved"] is True
            clock.advance(chord_callbacks.RESERVE_TTL_S)  # unused for their whole life
            expects = await raw.op("cb", "read", "chord_expects", chord_id=first)
            assert expects["reserved"] is False
            fresh = await reserve(raw, key_of(rng))
            assert fresh["ok"] and fresh["reserved"], fresh
            stored = [k for k, _ in await owner.node.storage.scan("wf:cb")]
            assert len(stored) == 1  # the expired ones were deleted from storage
        finally:
            await raw.transport.close()


async def test_an_expired_reservation_refuses_its_callback():
    configs, prefix = isolated_configs(2), unique_prefix()
    clock = ManualClock()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner", clock=clock)
    owner.queue("cb")
    async with owner.serving():
        raw = await serve(configs, prefix, owner)
        try:
            key = key_of(random.Random(3))
            assert (await reserve(raw, key))["reserved"]
            chord = wf.chord_id(key, "members", 1, "cb")
            clock.advance(chord_callbacks.RESERVE_TTL_S + 1)
            reply = await raw.op("cb", "produce", "enqueue", body=codec.encode_body({}),
                                 job_id=f"{chord}.callback", meta={"callback": {
                                     "id": chord, "queue": "members", "size": 1, "key": key}})
            refused(reply, "InvalidJob", "expired")
        finally:
            await raw.transport.close()


async def test_chord_open_naming_a_silent_callback_queue_asks_a_bounded_number_of_times():
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner", request_timeout_s=1.0)
    owner.queue("members")
    silent = ZenohTransport(configs[2], node_id="silent")
    asked: list[str] = []
    never = asyncio.Event()

    async def swallow(key: str, payload: bytes) -> bytes:
        asked.append(codec.decode_message(payload)["op"])
        await never.wait()  # never answers: the asker waits out its whole timeout
        return b""

    async with owner.serving():
        await silent.start()
        await silent.declare_queryable(f"{prefix}/q/nobody/rpc/read", swallow)
        raw = await serve(configs, prefix, owner)
        try:
            rng = random.Random(11)

            async def open_one() -> dict[str, Any]:
                key = key_of(rng)
                return await raw.op("members", "produce", "chord_open",
                                    chord_id=wf.chord_id(key, "members", 1, "nobody"), size=1,
                                    callback="nobody", key=key)

            replies = await asyncio.gather(*(open_one() for _ in range(300)))
            assert all(r["error"] == "OwnerUnavailable" for r in replies), replies[0]
            waited = [r for r in replies if "wait already" in r["message"]]
            assert len(asked) == chord_callbacks.MAX_ASKING_PER_QUEUE
            assert len(waited) == 300 - chord_callbacks.MAX_ASKING_PER_QUEUE
            again = await open_one()  # right after: not asked again
            refused(again, "OwnerUnavailable", "did not answer lately")
            assert len(asked) == chord_callbacks.MAX_ASKING_PER_QUEUE
            assert (await raw.op("members", "read", "ping"))["ok"]
        finally:
            never.set()
            await raw.transport.close()
            await silent.close()


async def test_invented_worker_ids_do_not_evict_a_working_workers_row():
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    worker = Istos(zenoh=configs[1], prefix=prefix, node_id="real")
    done = asyncio.Event()

    @worker.worker("q", poll_interval_s=60.0, park=False)  # silent while the flood runs
    async def work(job: Any) -> None:
        done.set()

    flood = ZenohTransport(configs[2], node_id="flood")
    async with owner.serving(), worker.serving():
        await flood.start()
        try:
            raw = Raw(flood, prefix)
            await owner.enqueue("q", {"n": 1})
            await asyncio.wait_for(done.wait(), 15)
            await wait_until(lambda: _acked(owner), timeout_s=15, what="job acked")

            async def fake(i: int) -> None:
                reply = await raw.op("q", "work", "claim", workers=[f"ghost-{i}:f#0"],
                                     node=f"ghost-{i}")
                assert reply["ok"] and reply["jobs"] == []

            for start in range(0, MAX_WORKERS + 500, 64):
                await asyncio.gather(*(fake(i) for i in range(start, start + 64)))
            page, rows, offset = None, [], 0
            while page is None or page["more"]:
                page = await raw.op("q", "read", "workers", offset=offset)
                rows.extend(page["workers"])
                offset = page["next_offset"]
            assert len(rows) == MAX_WORKERS
            real = [r for r in rows if r["node"] == "real"]
            assert len(real) == 1 and real[0]["acked"] == 1, real
        finally:
            await flood.close()


async def _acked(app: Istos) -> bool:
    stats = (await app.client("q").call("stats"))["stats"]
    return bool(stats["totals"]["acked"] == 1)
