"""Payload codecs (``Istos(codecs=[...])``): bodies and results leave the producer and the
worker encoded, so the owner and its storage never hold plaintext; keys rotate; a wrong key,
other codecs or tampered bytes fail the attempt with PayloadCodecError and the job is
dead-lettered, never run with garbage. The end-to-end tests run over real Zenoh on a private
loopback mesh with the owner on the shared Redis (its own key prefix)."""

from __future__ import annotations

import os
import uuid
import zlib
from typing import Any

import pytest
from helpers import count, wait_events
from services import drop_postgres_table, postgres_url, redis_url
from zenoh_util import isolated_configs, unique_prefix

from istos import ConfigError, InvalidJob, Istos, RedisStoragePlugin, SQLAlchemyStoragePlugin
from istos.errors import PayloadCodecError
from istos.payload import AesGcmCodec, CodecChain, ZlibCodec, describe, envelope, seal

pytest.importorskip("cryptography")

WAIT_S = 60.0
MARKER = "plaintext-marker-7f3a"
K1, K2 = os.urandom(32), os.urandom(32)


def chain(*codecs: Any) -> CodecChain:
    return CodecChain(codecs)


def test_a_chain_round_trips_and_its_envelope_names_the_codecs():
    c = chain(ZlibCodec(), AesGcmCodec({"k1": K1}, "k1"))
    body = c.encode_body({"to": MARKER, "n": [1, 2, 3]})
    assert MARKER.encode() not in body
    assert envelope(body)[0] == ["zlib", "aes-gcm"]
    assert describe(body) == f"encoded: zlib, aes-gcm ({len(body)} bytes)"
    assert c.decode_body(body) == {"to": MARKER, "n": [1, 2, 3]}
    plain = CodecChain().encode_body({"a": 1})  # no codecs: plain msgpack, as ever
    assert describe(plain) is None and CodecChain().decode_body(plain) == {"a": 1}
    # The CLI's views (which hold no codecs) show what the body is, not bytes or a guess.
    from istos.ops.operator import decode_body as shown
    assert shown(body) == f"<encoded: zlib, aes-gcm ({len(body)} bytes)>"
    # A body that compresses well is smaller than its msgpack form.
    big = {"text": "x" * 100_000}
    assert len(chain(ZlibCodec()).encode_body(big)) < 1000


def test_keys_rotate_a_reader_with_old_and_new_keys_decodes_both():
    old = chain(AesGcmCodec({"k1": K1}, "k1")).encode_body("old job")
    rotated = chain(AesGcmCodec({"k1": K1, "k2": K2}, "k2"))
    new = rotated.encode_body("new job")
    assert [rotated.decode_body(b) for b in (old, new)] == ["old job", "new job"]
    with pytest.raises(PayloadCodecError, match="no key with id 'k2'"):
        chain(AesGcmCodec({"k1": K1}, "k1")).decode_body(new)


def test_a_wrong_key_tampered_bytes_or_other_codecs_raise_naming_the_codec():
    c = chain(AesGcmCodec({"k1": K1}, "k1"))
    body = c.encode_body({"secret": MARKER})
    with pytest.raises(PayloadCodecError, match="aes-gcm: body does not authenticate"):
        chain(AesGcmCodec({"k1": K2}, "k1")).decode_body(body)
    names, payload = envelope(body)
    flipped = bytearray(payload)
    flipped[-1] ^= 1
    tampered = seal(names, bytes(flipped))
    with pytest.raises(PayloadCodecError, match="does not authenticate"):
        c.decode_body(tampered)
    with pytest.raises(PayloadCodecError, match="encoded with aes-gcm; this reader has no"):
        CodecChain().decode_body(body)
    with pytest.raises(PayloadCodecError, match="encoded with no codecs .* reader has zlib"):
        chain(ZlibCodec()).decode_body(CodecChain().encode_body("plain"))
    with pytest.raises(PayloadCodecError, match="zlib"):
        chain(ZlibCodec()).decode_body(
            seal(["zlib"], b"not zlib"))
    bomb = seal(
        ["zlib"], zlib.compress(b"\0" * (4 << 20)))
    with pytest.raises(PayloadCodecError, match="inflates past"):
        chain(ZlibCodec()).decode_body(bomb)


def test_bad_codec_configuration_is_refused():
    with pytest.raises(ConfigError):
        AesGcmCodec({"k1": b"short"}, "k1")
    with pytest.raises(ConfigError):
        AesGcmCodec({"k1": K1}, "k2")
    with pytest.raises(ConfigError):
        Istos(codecs=[object()])  # type: ignore[list-item]
    with pytest.raises(InvalidJob, match="once encoded"):
        chain(AesGcmCodec({"k1": K1}, "k1")).encode_body(os.urandom((1 << 20) - 8))


@pytest.mark.parametrize("kind", ["redis", "postgres"])
async def test_an_encrypted_queue_stores_no_plaintext_over_zenoh(kind):
    configs, prefix = isolated_configs(3), unique_prefix()
    storage, dump, drop = _store(kind)
    codecs = [ZlibCodec(), AesGcmCodec({"k1": K1}, "k1")]
    owner = Istos(storage, zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("secret", keep_results=True, max_attempts=1)
    owner.queue("plain", max_attempts=1)
    producer = Istos(zenoh=configs[1], prefix=prefix, node_id="prod", codecs=codecs)
    worker = Istos(zenoh=configs[2], prefix=prefix, node_id="wk", codecs=codecs)
    seen: list[Any] = []

    @worker.worker("secret")
    async def work(job: dict[str, Any]) -> dict[str, Any]:
        seen.append(job)
        return {"echo": job["to"]}

    try:
        async with owner.serving(), producer.serving():
            # A job that waits (delayed) and one that ran and kept its result, both stored.
            waiting = await producer.enqueue("secret", {"to": MARKER}, delay_s=3600)
            done = await producer.enqueue("secret", {"to": MARKER})
            plain = await owner.enqueue("plain", {"to": MARKER}, delay_s=3600)
            async with worker.serving():
                await wait_events(owner, lambda es: count(es, "acked", done) == 1, WAIT_S)
            assert seen == [{"to": MARKER}]
            assert (await producer.result("secret", done))["result"] == {"echo": MARKER}
            with pytest.raises(PayloadCodecError):  # the owner's app holds no codecs
                await owner.result("secret", done)
            stored = await dump()
    finally:
        await drop()
    secret = b"".join(k + v for k, v in stored.items() if b"plain" not in k)
    assert waiting.encode() in secret and done.encode() in secret  # the jobs are there...
    assert MARKER.encode() not in secret  # ...their bodies and results not in clear
    # The search is real: the plain queue's body is found in its own rows.
    assert MARKER.encode() in b"".join(v for k, v in stored.items() if b"plain" in k), plain


def _store(kind: str) -> tuple[Any, Any, Any]:
    """(storage, an async dump of every key and value it wrote, an async cleanup)."""
    if kind == "redis":
        import redis.asyncio as aioredis

        url, ns = redis_url(), unique_prefix().replace("/", ":")

        async def dump_redis() -> dict[bytes, bytes]:
            client = aioredis.from_url(url)
            try:
                return {k: await _dump(client, k) async for k in client.scan_iter(f"{ns}*")}
            finally:
                await client.aclose()

        async def wipe_redis() -> None:
            client = aioredis.from_url(url)
            try:
                keys = [k async for k in client.scan_iter(f"{ns}*")]
                if keys:
                    await client.delete(*keys)
            finally:
                await client.aclose()
        return RedisStoragePlugin(url, key_prefix=ns), dump_redis, wipe_redis
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    url, table = postgres_url(), f"t_{uuid.uuid4().hex[:10]}"

    async def dump_pg() -> dict[bytes, bytes]:
        engine = create_async_engine(url)
        try:
            async with engine.connect() as conn:
                rows = (await conn.execute(text(f"SELECT ns, key, value FROM {table}"))).all()
        finally:
            await engine.dispose()
        return {f"{ns}/{key}".encode(): bytes(value) for ns, key, value in rows}

    return SQLAlchemyStoragePlugin(url, table=table), dump_pg, \
        lambda: drop_postgres_table(url, table)


async def _dump(client: Any, key: bytes) -> bytes:
    kind = (await client.type(key)).decode()
    if kind == "string":
        return bytes(await client.get(key) or b"")
    if kind == "hash":
        return b"".join(k + v for k, v in (await client.hgetall(key)).items())
    if kind == "zset":
        return b"".join(m for m, _ in await client.zrange(key, 0, -1, withscores=True))
    if kind == "list":
        return b"".join(await client.lrange(key, 0, -1))
    if kind == "set":
        return b"".join(await client.smembers(key))
    return b""


async def test_a_worker_with_a_wrong_key_fails_each_attempt_and_the_job_dead_letters():
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q", max_attempts=2, retry_backoff_s=0.01, retry_backoff_max_s=0.01)
    producer = Istos(zenoh=configs[1], prefix=prefix, node_id="prod",
                     codecs=[AesGcmCodec({"k1": K1}, "k1")])
    worker = Istos(zenoh=configs[2], prefix=prefix, node_id="wk",
                   codecs=[AesGcmCodec({"k1": K2}, "k1")])  # same id, other key
    ran: list[Any] = []

    @worker.worker("q")
    async def work(job: Any) -> None:
        ran.append(job)

    async with owner.serving(), producer.serving(), worker.serving():
        job_id = await producer.enqueue("q", {"to": MARKER})
        await wait_events(owner, lambda es: count(es, "dead_lettered", job_id) == 1, WAIT_S)
        dead = await producer.dead_letters("q")
        blind = await owner.dead_letters("q")
    assert ran == []  # never run with garbage
    assert dead[0]["data"] == {"to": MARKER} and dead[0]["attempts"] == 2
    assert [h["error"].split(":")[0] for h in dead[0]["history"]] == ["PayloadCodecError"] * 2
    assert "aes-gcm" in dead[0]["last_error"]
    assert MARKER not in str(blind[0]) and blind[0]["data"] is None
    assert blind[0]["encoded"].startswith("encoded: aes-gcm (")


async def test_a_sync_producer_with_codecs_enqueues_encoded_and_reads_results_over_zenoh():
    import asyncio

    from istos import SyncProducer

    configs, prefix = isolated_configs(3), unique_prefix()
    codecs = [ZlibCodec(), AesGcmCodec({"k1": K1}, "k1")]
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q", keep_results=True)
    worker = Istos(zenoh=configs[1], prefix=prefix, node_id="wk", codecs=codecs)

    @worker.worker("q")
    async def double(x: int) -> int:
        return 2 * x

    def produce() -> list[str]:
        with SyncProducer(configs[2], prefix=prefix, request_timeout_s=20,
                          codecs=codecs) as sp:
            return [sp.enqueue("q", 21, job_id="one"), *sp.enqueue_many("q", [1, 2])]

    def ask(job_ids: list[str]) -> list[Any]:
        with SyncProducer(configs[2], prefix=prefix, request_timeout_s=20,
                          codecs=codecs) as sp:
            return [sp.result("q", j)["result"] for j in job_ids]

    async with owner.serving(), worker.serving():
        ids = await asyncio.to_thread(produce)
        await wait_events(owner, lambda es: count(es, "acked") == 3, WAIT_S)
        assert all(describe(owner.owners["q"].state.jobs[j].body) for j in ids)
        assert await asyncio.to_thread(ask, ids) == [42, 2, 4]
