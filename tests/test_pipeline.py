"""app.pipeline: pipelined enqueues over real Zenoh (and to an owner in this process), each id
confirmed by flush() or listed in NotAccepted. Owner processes SIGKILLed mid-pipeline are in
test_pipeline_chaos.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from test_enqueue_many import count_requests, redis_server  # noqa: F401 - a fixture
from zenoh_util import isolated_configs, unique_prefix

from istos import (
    ConfigError,
    InvalidJob,
    Istos,
    IstosError,
    NotAccepted,
    StorageUnavailable,
    SyncProducer,
)


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


async def test_one_turn_of_jobs_leaves_in_few_requests_and_flush_confirms_each():
    async with owner_and_producer() as (owner, producer):
        served = count_requests(owner)
        async with producer.pipeline("q") as p:
            ids = [p.enqueue({"n": i}, priority=2) for i in range(1000)]
            assert p.pending == 1000  # handed over, nothing answered yet
            confirmed = await p.flush()
        assert sorted(confirmed) == sorted(ids) and len(set(ids)) == 1000
        assert served == [1000]  # one turn, one request
        state = owner.owners["q"].state
        assert all(state.jobs[j].priority == 2 for j in ids)
        assert p.pending == 0 and await p.flush() == []


async def test_turns_keep_sending_while_replies_are_outstanding():
    """A producer that yields between jobs: each turn's jobs leave at its end, and never more
    than max_in_flight requests wait for replies."""
    async with owner_and_producer() as (owner, producer):
        served = count_requests(owner)
        async with producer.pipeline("q", max_in_flight=2) as p:
            ids = []
            for i in range(200):
                ids.append(p.enqueue(i, job_id=f"j{i}"))
                assert p._in_flight <= 2
                await asyncio.sleep(0)
        assert sum(served) == 200 and len(served) < 200
        assert set(owner.owners["q"].state.jobs) == set(ids)


async def test_resending_the_same_ids_adds_nothing_twice_and_confirms_them():
    async with owner_and_producer() as (owner, producer):
        async with producer.pipeline("q") as p:
            first = [p.enqueue(i, job_id=f"k{i}") for i in range(20)]
        async with producer.pipeline("q") as p:
            again = [p.enqueue(i, job_id=f"k{i}") for i in range(20)]
            assert await p.flush() == again == first
        assert len(owner.owners["q"].state.jobs) == 20


async def test_confirmation_future_per_id():
    async with owner_and_producer() as (owner, producer):
        async with producer.pipeline("q") as p:
            jid = p.enqueue("x")
            assert await p.confirmation(jid) == jid
            assert (await p.confirmation(jid)).startswith(jid)  # settled: answered at once
            with pytest.raises(KeyError):
                p.confirmation("never-sent")


async def test_a_bad_job_raises_at_enqueue_and_nothing_is_handed_over():
    async with owner_and_producer() as (owner, producer):
        async with producer.pipeline("q") as p:
            with pytest.raises(InvalidJob):
                p.enqueue(object())
            with pytest.raises(ConfigError):
                p.enqueue(1, delay_s=-1)
            assert p.pending == 0
        with pytest.raises(ConfigError):
            producer.pipeline("q", max_in_flight=0)


async def test_to_the_owner_in_this_process():
    app = Istos(zenoh=isolated_configs(1)[0], prefix=unique_prefix())
    app.queue("q")
    async with app.serving():
        async with app.pipeline("q") as p:
            ids = [p.enqueue(i) for i in range(50)]
        assert set(app.owners["q"].state.jobs) == set(ids)


async def test_not_serving_raises():
    app = Istos(zenoh=isolated_configs(1)[0], prefix=unique_prefix())
    with pytest.raises(IstosError):
        async with app.pipeline("q"):
            pass


async def test_storage_outage_lists_every_refused_id_and_none_is_lost(redis_server):  # noqa: F811
    async with owner_and_producer(redis_server.storage()) as (owner, producer):
        p = producer.pipeline("q")
        async with p:
            before = [p.enqueue(i, job_id=f"a{i}") for i in range(30)]
            assert await p.flush() == before
            redis_server.kill()
            during = [p.enqueue(i, job_id=f"b{i}") for i in range(30)]
            with pytest.raises(NotAccepted) as info:
                await p.flush()
        err = info.value
        assert sorted(err.job_ids) == sorted(during) and err.refused == err.job_ids
        assert err.accepted == [] and err.unanswered == []
        assert all(isinstance(c, StorageUnavailable) for c in err.causes.values())
        assert "30 job(s) not confirmed" in str(err)
        assert set(owner.owners["q"].state.jobs) == set(before)  # nothing refused in memory


# -- SyncProducer.pipeline ------------------------------------------------------------------
async def test_sync_pipeline_from_a_thread_confirms_every_id():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")

    def produce() -> tuple[list[str], list[str], int]:
        with SyncProducer(configs[1], prefix=prefix, request_timeout_s=10) as sp:
            with sp.pipeline("q", max_in_flight=2) as p:
                ids = [p.enqueue({"n": i}, job_id=f"s{i}") for i in range(3000)]
                sent_before_flush = 3000 - len(p._buffer)
                confirmed = p.flush()
            with pytest.raises(InvalidJob):
                p.enqueue(object())
            return ids, confirmed, sent_before_flush

    async with owner.serving():
        served = count_requests(owner)
        ids, confirmed, sent = await asyncio.to_thread(produce)
        assert set(owner.owners["q"].state.jobs) == set(ids)
    assert sorted(confirmed) == sorted(ids)
    assert sent > 0  # jobs left while the producer was still handing them over
    assert sum(served) == 3000 and len(served) < 3000  # batched behind outstanding requests


async def test_sync_pipeline_with_no_owner_reports_every_id_unanswered():
    configs, prefix = isolated_configs(1), unique_prefix()

    def produce() -> NotAccepted:
        with SyncProducer(configs[0], prefix=prefix, request_timeout_s=0.5) as sp:
            p = sp.pipeline("q")
            ids = [p.enqueue(i) for i in range(10)]
            with pytest.raises(NotAccepted) as info:
                p.flush()
            assert sorted(info.value.unanswered) == sorted(ids)
            assert p.flush() == []  # afresh
            return info.value

    err = await asyncio.to_thread(produce)
    assert err.refused == [] and err.accepted == []


async def test_sync_pipeline_on_the_loop_that_runs_the_owner():
    app = Istos(zenoh=isolated_configs(1)[0], prefix=(prefix := unique_prefix()))
    app.queue("q")
    async with app.serving():
        with SyncProducer(isolated_configs(1)[0], prefix=prefix) as sp:
            with sp.pipeline("q") as p:
                ids = [p.enqueue(i) for i in range(20)]
            assert p.pending == 0  # answered in-process, within each call
        assert set(app.owners["q"].state.jobs) == set(ids)


async def test_pipelines_apply_the_payload_codecs():
    from istos.payload import CodecChain, ZlibCodec

    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    producer = Istos(zenoh=configs[1], prefix=prefix, codecs=[ZlibCodec()])

    def sync_side() -> str:
        with SyncProducer(configs[2], prefix=prefix, codecs=[ZlibCodec()]) as sp:
            with sp.pipeline("q") as p:
                return p.enqueue({"to": "sync"})

    async with owner.serving(), producer.serving():
        async with producer.pipeline("q") as p:
            async_id = p.enqueue({"to": "async"})
        sync_id = await asyncio.to_thread(sync_side)
        jobs = owner.owners["q"].state.jobs
        chain = CodecChain([ZlibCodec()])
        assert chain.decode_body(jobs[async_id].body) == {"to": "async"}
        assert chain.decode_body(jobs[sync_id].body) == {"to": "sync"}
        assert b"async" not in jobs[async_id].body  # encoded, not plain msgpack


# -- options: what the pipelines take of app.enqueue's, and what they refuse -----------------
async def test_pipelines_carry_a_start_deadline():
    """expires_s and start_by reach the owner as app.enqueue's do (its clock and ours are the
    same machine's: a deadline an hour out lands within a minute of now + 3600)."""
    import time

    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    producer = Istos(zenoh=configs[1], prefix=prefix, request_timeout_s=10.0)
    at = time.time() + 7200

    def sync_side() -> list[str]:
        with SyncProducer(configs[2], prefix=prefix, request_timeout_s=10) as sp:
            with sp.pipeline("q") as p:
                return [p.enqueue("s1", expires_s=3600), p.enqueue("s2", start_by=at)]

    async with owner.serving(), producer.serving():
        async with producer.pipeline("q") as p:
            a1 = p.enqueue("a1", expires_s=3600)
            a2 = p.enqueue("a2", start_by=at)
            plain = p.enqueue("a3")
            with pytest.raises(ConfigError, match="start_by"):
                p.enqueue("both", expires_s=5, start_by=at)
        s1, s2 = await asyncio.to_thread(sync_side)
        jobs = owner.owners["q"].state.jobs
        now = time.time()
        for jid in (a1, s1):
            assert jobs[jid].start_by is not None and abs(jobs[jid].start_by - now - 3600) < 60
        for jid in (a2, s2):
            assert jobs[jid].start_by == pytest.approx(at)
        assert jobs[plain].start_by is None


_REFUSED: dict[str, Any] = {"unique_key": "k", "unique": "queued", "unique_s": 1.0,
                           "debounce_key": "k", "debounce_s": 1.0, "debounce_max_s": 2.0,
                           "debounce": "last", "timeout_s": 1.0}


def _refuses_each_by_name(p: Any) -> None:
    from istos import UnsupportedOption

    for option, value in _REFUSED.items():
        with pytest.raises(UnsupportedOption) as info:
            p.enqueue("x", **{option: value})
        assert isinstance(info.value, ConfigError) and info.value.option == option
        assert repr(option) in str(info.value)
    with pytest.raises(TypeError, match="no_such_option"):
        p.enqueue("x", no_such_option=1)
    assert p.pending == 0


async def test_pipelines_refuse_keyed_options_by_name():
    from istos.pipeline import UNSUPPORTED_OPTIONS

    assert set(UNSUPPORTED_OPTIONS) == set(_REFUSED)
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")

    def sync_side() -> None:
        with SyncProducer(configs[1], prefix=prefix, request_timeout_s=10) as sp:
            with sp.pipeline("q") as p:
                _refuses_each_by_name(p)

    async with owner.serving():
        async with owner.pipeline("q") as p:
            _refuses_each_by_name(p)
        await asyncio.to_thread(sync_side)
        assert owner.owners["q"].state.jobs == {}
