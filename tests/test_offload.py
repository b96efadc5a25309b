"""Large bodies (``istos.offload``): bodies over a threshold go to an object store and travel
as a reference; the owner's janitor deletes a job's objects once the job is forgotten; a store
that fails at enqueue raises before anything is sent. End-to-end over real Zenoh, the store a
tmp directory."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from helpers import count, wait_events
from zenoh_util import isolated_configs, unique_prefix

from istos import ConfigError, InvalidJob, Istos, codec
from istos.clock import ManualClock
from istos.errors import OffloadUnavailable, PayloadCodecError
from istos.offload import (
    DirectoryStore,
    FsspecStore,
    OffloadCodec,
    OffloadJanitor,
    referenced_key,
)
from istos.payload import AesGcmCodec, CodecChain, ZlibCodec, describe

pytest.importorskip("cryptography")

WAIT_S = 60.0
BIG = 64 << 20
KEY = os.urandom(32)


def chain_codecs(store: Any, threshold: int = 64 << 10) -> list[Any]:
    return [ZlibCodec(max_output_bytes=BIG), AesGcmCodec({"k": KEY}, "k"),
            OffloadCodec(store, threshold_bytes=threshold, max_body_bytes=BIG)]


def objects(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if not p.name.startswith(".")) \
        if path.exists() else []


class BrokenStore:
    def put(self, key: str, data: bytes) -> None:
        raise ConnectionError("object store unreachable")

    def get(self, key: str) -> bytes:
        raise ConnectionError("object store unreachable")

    def delete(self, key: str) -> None:
        raise ConnectionError("object store unreachable")


@pytest.mark.fast
def test_small_bodies_travel_inline_and_large_ones_as_a_reference(tmp_path):
    store = DirectoryStore(tmp_path / "blobs")
    chain = CodecChain(chain_codecs(store))
    small = chain.encode_body({"n": 1})
    assert referenced_key(small) is None and objects(tmp_path / "blobs") == []
    data = {"blob": os.urandom(2 << 20), "marker": "offload-marker"}
    body = chain.encode_body(data)
    assert len(body) < 200 and describe(body).startswith("encoded: zlib, aes-gcm, offload")
    key = referenced_key(body)
    assert key is not None and objects(tmp_path / "blobs") == [key]
    assert b"offload-marker" not in (tmp_path / "blobs" / key).read_bytes()
    assert chain.decode_body(body) == data
    assert chain.decode_body(small) == {"n": 1}
    store.delete(key)
    with pytest.raises(OffloadUnavailable, match="reading body"):
        chain.decode_body(body)
    store.delete(key)  # deleting a missing object is fine
    # Without an offload codec the 1 MiB body cap is unchanged.
    with pytest.raises(InvalidJob, match="limit is 1048576"):
        CodecChain([ZlibCodec()]).encode_body({"blob": os.urandom(2 << 20)})
    with pytest.raises(InvalidJob, match=f"limit is {BIG}"):
        chain.encode_body(b"x" * (BIG + 1))
    assert codec.MAX_BODY_BYTES == 1 << 20


@pytest.mark.fast
def test_a_chain_with_offload_is_checked_when_built(tmp_path):
    store = DirectoryStore(tmp_path)
    with pytest.raises(ConfigError, match="must be the last one"):
        CodecChain([OffloadCodec(store), ZlibCodec()])
    with pytest.raises(ConfigError, match="max_output_bytes=268435456"):
        CodecChain([ZlibCodec(), OffloadCodec(store)])
    with pytest.raises(ConfigError, match="not an object store"):
        OffloadCodec(object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="threshold_bytes"):
        OffloadCodec(store, threshold_bytes=0)
    with pytest.raises(OffloadUnavailable, match="ConnectionError: object store unreachable"):
        CodecChain([OffloadCodec(BrokenStore(), threshold_bytes=10)]).encode_body("x" * 100)
    with pytest.raises(PayloadCodecError, match="malformed body reference"):
        OffloadCodec(store).decode(b"\x01../../etc/passwd")


@pytest.mark.fast
def test_an_fsspec_store_round_trips():
    pytest.importorskip("fsspec")
    store = FsspecStore("memory://istos-test-offload")
    chain = CodecChain([OffloadCodec(store, threshold_bytes=10)])
    body = chain.encode_body("y" * 1000)
    assert chain.decode_body(body) == "y" * 1000
    key = referenced_key(body)
    assert key is not None
    store.delete(key)
    with pytest.raises(OffloadUnavailable):
        chain.decode_body(body)


async def test_a_20_mib_body_round_trips_and_its_object_is_gone_once_the_job_is_forgotten(
        tmp_path):
    path = tmp_path / "blobs"
    store = DirectoryStore(path)
    configs, prefix = isolated_configs(3), unique_prefix()
    # The kept result expires when the test moves the owner's clock: on the loop's clock a
    # loaded machine could let its 0.5 s TTL pass before the 3 MiB result was read back.
    clock = ManualClock()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner", clock=clock)
    owner.queue("big")
    owner.queue("kept", keep_results=True, result_ttl_s=0.5, sweep_interval_s=0.05)
    janitor = OffloadJanitor(store).install(owner)
    producer = Istos(zenoh=configs[1], prefix=prefix, node_id="prod",
                     codecs=chain_codecs(store))
    worker = Istos(zenoh=configs[2], prefix=prefix, node_id="wk", codecs=chain_codecs(store))
    payload = os.urandom(20 << 20)
    digests: list[str] = []

    @worker.worker("big", poll_interval_s=0.05)
    async def digest(data: Any) -> None:
        digests.append(hashlib.sha256(data["blob"]).hexdigest())

    @worker.worker("kept", poll_interval_s=0.05)
    async def echo(data: Any) -> Any:
        return {"back": data["blob"]}  # a large result: offloaded by the worker

    async with owner.serving(), producer.serving(), worker.serving():
        job_id = await producer.enqueue("big", {"blob": payload})
        assert len(objects(path)) == 1  # stored before the enqueue returned
        await wait_events(owner, lambda es: count(es, "acked", job_id) == 1, WAIT_S)
        await janitor.drain()
        assert digests == [hashlib.sha256(payload).hexdigest()]
        assert objects(path) == []
        # A kept result: its object and the body's stay until the result expires.
        kept = await producer.enqueue("kept", {"blob": payload[: 3 << 20]})
        await wait_events(owner, lambda es: count(es, "acked", kept) == 1, WAIT_S)
        result = await producer.result("kept", kept)
        assert result["result"] == {"back": payload[: 3 << 20]}
        assert len(objects(path)) == 2
        clock.advance(0.5)
        await wait_events(owner, lambda es: count(es, "result_expired", kept) == 1, WAIT_S)
        await janitor.drain()
        assert objects(path) == [] and janitor.deleted == 3


async def test_a_store_that_fails_at_enqueue_raises_before_anything_is_enqueued():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("big")
    producer = Istos(zenoh=configs[1], prefix=prefix, node_id="prod",
                     codecs=[OffloadCodec(BrokenStore(), threshold_bytes=1024)])
    async with owner.serving(), producer.serving():
        with pytest.raises(OffloadUnavailable, match="object store unreachable"):
            await producer.enqueue("big", "x" * 4096)
        with pytest.raises(OffloadUnavailable):
            await producer.enqueue_many("big", ["small", "x" * 4096])
        assert await producer.enqueue("big", "small") is not None  # inline: no store needed
        assert len(owner.owners["big"].state.jobs) == 1


@pytest.mark.redis
async def test_the_janitor_of_a_restarted_owner_deletes_what_its_recovered_jobs_refer_to(
        tmp_path):
    from test_payload_codecs import _store

    path = tmp_path / "blobs"
    store = DirectoryStore(path)
    configs, prefix = isolated_configs(4), unique_prefix()
    storage, _, drop = _store("redis")

    def owner_app(node: str, zenoh: Any) -> Istos:
        app = Istos(storage, zenoh=zenoh, prefix=prefix, node_id=node)
        app.queue("big", max_attempts=1, admin=True)
        return app

    first = owner_app("owner1", configs[0])
    OffloadJanitor(store).install(first)
    producer = Istos(zenoh=configs[1], prefix=prefix, node_id="prod",
                     codecs=chain_codecs(store))
    worker = Istos(zenoh=configs[2], prefix=prefix, node_id="wk", codecs=chain_codecs(store))

    @worker.worker("big", poll_interval_s=0.05)
    async def work(data: Any) -> None:
        if data["fail"]:
            raise RuntimeError("dead on purpose")

    try:
        async with producer.serving():
            async with first.serving():
                done = await producer.enqueue("big", {"blob": os.urandom(1 << 20),
                                                      "fail": False})
                dead = await producer.enqueue("big", {"blob": os.urandom(1 << 20),
                                                      "fail": True})
            assert len(objects(path)) == 2
            second = owner_app("owner2", configs[3])  # recovers both jobs from Redis
            janitor = OffloadJanitor(store).install(second)
            async with second.serving(), worker.serving():
                await wait_events(second, lambda es: count(es, "acked", done) == 1
                                  and count(es, "dead_lettered", dead) == 1, WAIT_S)
                await janitor.drain()
                assert len(objects(path)) == 1  # the dead letter still needs its body
                assert (await second.client("big").call("purge_dead"))["purged"] == 1
                await janitor.drain()
                assert objects(path) == [] and janitor.deleted == 2
    finally:
        await drop()
