"""Payload codecs beyond enqueue and @app.worker: chords (whose owner holds no codecs composes
the callback from encoded results), schedules, pub/sub, a notebook's LiveQueue(codecs=...),
and operator searches that say they cannot look inside encoded bodies. End-to-end over real
Zenoh on private loopback meshes."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import msgpack
import pytest
from helpers import count, wait_events
from zenoh_util import isolated_configs, unique_prefix

from istos import Istos
from istos.errors import PayloadCodecError
from istos.payload import AesGcmCodec, CodecChain, ZlibCodec, compose, describe, is_encoded

pytest.importorskip("cryptography")

WAIT_S = 60.0
MARKER = "plaintext-marker-c0dec"
KEY = os.urandom(32)


def codecs() -> list[Any]:
    return [ZlibCodec(), AesGcmCodec({"k1": KEY}, "k1")]


@pytest.mark.fast
def test_a_composed_callback_decodes_part_by_part_and_shows_as_encoded():
    chain = CodecChain(codecs())
    body = compose([chain.encode_body({"r": i}) for i in range(3)],
                   chain.encode_body({"extra": MARKER}))
    assert body is not None and MARKER.encode() not in body and is_encoded(body)
    assert chain.decode_body(body) == {"results": [{"r": 0}, {"r": 1}, {"r": 2}],
                                       "input": {"extra": MARKER}}
    assert describe(body) == f"encoded: chord callback of 3 results (zlib, aes-gcm) " \
        f"({len(body)} bytes)"
    with pytest.raises(PayloadCodecError, match="this reader has no codecs"):
        CodecChain().decode_body(body)
    # Plain results and a plain input: an ordinary body, as without codecs.
    assert compose([msgpack.packb(1)], {"x": 1}) is None
    assert compose([], None) is None
    from istos.ops.operator import decode_body as shown
    assert shown(body).startswith("<encoded: chord callback of 3 results")
    from istos_nb.live.reply_tables import decode
    assert decode(body) == f"<{describe(body)}>"
    assert decode(body, chain)["input"] == {"extra": MARKER}


async def test_a_chord_with_codecs_fires_its_callback_with_decoded_results():
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")  # no codecs
    owner.queue("members", retry_backoff_s=0.01)
    owner.queue("cb", retry_backoff_s=0.01)
    producer = Istos(zenoh=configs[1], prefix=prefix, node_id="prod", codecs=codecs())
    worker = Istos(zenoh=configs[2], prefix=prefix, node_id="wk", codecs=codecs())
    got: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    @worker.worker("members", poll_interval_s=0.05, concurrency=3)
    async def member(data: Any) -> Any:
        return {"echo": data, "secret": MARKER}

    @worker.worker("cb", poll_interval_s=0.05)
    async def callback(data: Any) -> None:
        if not got.done():
            got.set_result(data)

    async with owner.serving(), producer.serving():
        chord_id = await producer.chord("members", [1, 2, 3],
                                        callback=("cb", {"note": MARKER}))
        # The members' meta (stored by the owner) holds the chord's input encoded. (Read
        # before the worker starts: a member acked is forgotten, with its meta.)
        held = [r for r in owner.owners["members"].state.jobs.values()
                if r.job_id.startswith(chord_id)]
        assert len(held) == 3 and all(MARKER.encode() not in msgpack.packb(r.meta)
                                      for r in held)
        async with worker.serving():
            data = await asyncio.wait_for(got, WAIT_S)
        assert data == {"results": [{"echo": i, "secret": MARKER} for i in (1, 2, 3)],
                        "input": {"note": MARKER}}
        rec = owner.owners["cb"].state.jobs.get(f"{chord_id}.callback")
        assert rec is None or MARKER.encode() not in rec.body


async def test_schedules_and_pubsub_carry_encoded_bodies():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("ticks", keep_results=True)  # done jobs (and their bodies) stay held
    app = Istos(zenoh=configs[1], prefix=prefix, node_id="app", codecs=codecs())
    app.schedule("ticks", {"tick": MARKER}, every_s=0.05)
    ticks: list[Any] = []
    events: asyncio.Queue[Any] = asyncio.Queue()

    @app.worker("ticks", poll_interval_s=0.05)
    async def tick(data: Any) -> None:
        ticks.append(data)

    @app.subscribe("news")
    async def news(data: Any) -> None:
        events.put_nowait(data)

    bodies: list[bytes] = []
    async with owner.serving(), app.serving():
        await wait_events(owner, lambda es: count(es, "acked") >= 2, WAIT_S)
        bodies = [r.body for r in owner.owners["ticks"].state.jobs.values()]
        await app.publish("news", {"headline": MARKER})
        assert await asyncio.wait_for(events.get(), WAIT_S) == {"headline": MARKER}
    assert ticks[0] == {"tick": MARKER}
    assert bodies and all(MARKER.encode() not in b and is_encoded(b) for b in bodies)


async def test_a_live_queue_with_codecs_decodes_and_a_search_says_what_it_skipped():
    pytest.importorskip("pandas")
    from istos.ops.operator import Operator
    from istos_nb import aattach

    configs, prefix = isolated_configs(4), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    producer = Istos(zenoh=configs[1], prefix=prefix, node_id="prod", codecs=codecs())
    async with owner.serving(), producer.serving():
        await producer.enqueue("q", {"user": {"id": 7}, "secret": MARKER})
        lq = await aattach("q", configs[2], prefix=prefix, codecs=codecs())
        try:
            df = await lq.ajobs()
            assert df["data"].tolist() == [{"user": {"id": 7}, "secret": MARKER}]
            found = await lq.ajobs(where={"user.id": 7})
            assert len(found) == 0 and found.attrs["unsearched"] == 1
        finally:
            await asyncio.to_thread(lq.close)
        plain = await aattach("q", configs[2], prefix=prefix)
        try:
            (shown,) = (await plain.ajobs())["data"].tolist()
            assert shown.startswith("<encoded: zlib, aes-gcm (")
        finally:
            await asyncio.to_thread(plain.close)
        async with Operator(configs[3], prefix=prefix, timeout_s=20) as op:
            notes: dict[str, int] = {}
            rows, _, _ = await op.jobs("q", where={"user.id": 7}, notes=notes)
            assert rows == [] and notes == {"unsearched": 1}


@pytest.mark.parametrize("worker_codecs", ["fewer", "none", "offload"])
async def test_a_codec_list_that_differs_fails_the_attempt_naming_the_codecs(
        worker_codecs, tmp_path):
    from istos.offload import DirectoryStore, OffloadCodec

    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q", max_attempts=2, retry_backoff_s=0.01, retry_backoff_max_s=0.01)
    producer = Istos(zenoh=configs[1], prefix=prefix, node_id="prod", codecs=codecs())
    theirs = {"fewer": [ZlibCodec()], "none": [],
              "offload": [codecs()[1], OffloadCodec(DirectoryStore(tmp_path))]}[worker_codecs]
    worker = Istos(zenoh=configs[2], prefix=prefix, node_id="wk", codecs=theirs)
    ran: list[Any] = []

    @worker.worker("q", poll_interval_s=0.05)
    async def work(data: Any) -> None:
        ran.append(data)

    async with owner.serving(), producer.serving(), worker.serving():
        job_id = await producer.enqueue("q", {"secret": MARKER})
        await wait_events(owner, lambda es: count(es, "dead_lettered", job_id) == 1, WAIT_S)
        (dead,) = await producer.dead_letters("q")
    assert ran == []  # never run with garbage
    have = {"fewer": "zlib", "none": "no codecs", "offload": "aes-gcm, offload"}
    assert dead["last_error"] == ("PayloadCodecError: body encoded with zlib, aes-gcm; this "
                                  f"reader has {have[worker_codecs]}")
    assert dead["data"] == {"secret": MARKER}
