"""Debounce: ``enqueue(..., debounce_key=K, debounce_s=, debounce_max_s=, debounce=)``, one run
per burst. Pure state, the producer's checks, the wire, and real Zenoh on every storage across
an owner restart."""

from __future__ import annotations

import asyncio
import time

import pytest
import test_durable
from helpers import count, wait_events
from zenoh_util import isolated_configs, unique_prefix

from istos import ConfigError, InvalidJob, Istos
from istos.core.debounce import DebounceSpec, rebounce
from istos.core.state import QueuePolicy, QueueState
from istos.protocol import check_request
from istos.transport.local import LocalMesh

storage_factory = test_durable.storage_factory  # memory, Redis, PostgreSQL, SQLite


def _call(state: QueueState, jid: str, body: bytes, spec: DebounceSpec, now: float) -> str:
    """What the owner does for one call (owner/handlers/debounce_gate.py and accept.py), purely."""
    rec = state.debounce.open_job(spec.key, state.jobs)
    if rec is not None:
        rebounce(state, rec, body, spec, now)
        return rec.job_id
    new = spec.apply(state.new_record(jid, body, now, delay_s=spec.debounce_s), now)
    state.insert(new, now)
    state.dirty.append(new)
    return jid


@pytest.mark.fast
def test_pure_a_burst_runs_once_with_the_last_data_capped_by_max_s():
    state = QueueState("q", QueuePolicy())
    spec = DebounceSpec("reindex:7", 2.0, 5.0)
    ids = {_call(state, f"j{i}", bytes([i]), spec, float(i)) for i in range(4)}  # t=0..3
    assert ids == {"j0"}
    rec = state.jobs["j0"]
    assert rec.body == b"\x03" and rec.ready_at == 5.0  # min(3 + 2, 0 + 5)
    assert state.claim(["w"], 4.9) == []
    (run,) = state.claim(["w"], 5.0)
    assert run.job_id == "j0" and len(state.jobs) == 1
    assert _call(state, "j9", b"n", spec, 6.0) == "j9"  # started: a new burst
    kinds = [e.kind for e in state.drain()[1]]
    assert kinds.count("enqueued") == 2 and kinds.count("updated") == 3


@pytest.mark.fast
def test_pure_first_mode_keeps_the_first_data_and_still_moves_the_start():
    state = QueueState("q", QueuePolicy())
    spec = DebounceSpec("k", 2.0, None, "first")
    _call(state, "a", b"first", spec, 0.0)
    _call(state, "b", b"second", spec, 1.5)
    rec = state.jobs["a"]
    assert rec.body == b"first" and rec.ready_at == 3.5 and "b" not in state.jobs


@pytest.mark.fast
def test_wire_refuses_bad_debounce_fields_naming_them():
    base = {"v": 1, "op": "enqueue", "body": b"x", "job_id": "a"}
    check_request({**base, "debounce": {"key": "k", "s": 2.0, "max_s": 30.0}}, bool)
    for bad, field in (({"key": "k"}, "debounce.s"), ({"key": "k", "s": -1}, "debounce.s"),
                       ({"key": "k", "s": 5, "max_s": 1}, "debounce.max_s"),
                       ({"key": "k", "s": 5, "mode": "middle"}, "debounce.mode"),
                       ({"key": "k", "s": float("inf")}, "debounce.s")):
        with pytest.raises(InvalidJob, match=field.replace(".", r"\.")):
            check_request({**base, "debounce": bad}, bool)
    many = {"v": 1, "op": "enqueue_many", "items": [
        {"body": b"x", "job_id": "a", "debounce": {"key": "k", "s": 1}}]}
    with pytest.raises(InvalidJob, match=r"items\[0\]\.debounce"):
        check_request(many, bool)


def test_producer_checks_debounce_options_before_sending():
    app = Istos(transport=LocalMesh().transport("p"))
    for kw, field in (({"debounce_key": "k"}, "needs debounce_s"),
                      ({"debounce_key": "k", "debounce_s": -1}, "debounce_s"),
                      ({"debounce_key": "k", "debounce_s": float("nan")}, "debounce_s"),
                      ({"debounce_key": "k", "debounce_s": 5, "debounce_max_s": 1},
                       "debounce_max_s"),
                      ({"debounce_key": "k", "debounce_s": 5, "debounce": "middle"},
                       "debounce must"),
                      ({"debounce_s": 5}, "need a debounce_key"),
                      ({"debounce_key": "k", "debounce_s": 5, "delay_s": 1}, "delay_s"),
                      ({"debounce_key": "k", "debounce_s": 5, "unique_key": "u"},
                       "unique_key")):
        with pytest.raises(ConfigError, match=field):
            asyncio.run(app.enqueue("q", 1, **kw))


async def test_debounce_over_zenoh_on_every_storage_across_a_restart(storage_factory):
    configs, prefix = isolated_configs(3), unique_prefix()
    first = Istos(storage=storage_factory(), zenoh=configs[0], prefix=prefix, node_id="o1")
    first.queue("q")
    producer = Istos(zenoh=configs[1], prefix=prefix, node_id="p")
    runs: list[int] = []

    @producer.worker("q", poll_interval_s=0.1)
    async def handle(job):
        runs.append(job)

    burst = {"debounce_key": "reindex:7", "debounce_s": 3600.0, "debounce_max_s": 7200.0}
    async with producer.serving():
        async with first.serving():
            jid = await producer.enqueue("q", 1, **burst)
            assert jid.created
            again = await asyncio.gather(*(producer.enqueue("q", n, **burst)
                                           for n in (2, 3, 4)))
            assert all(a == jid and a.reason == "debounce_key" for a in again)
            rec = first.owners["q"].state.jobs[jid]
            assert len(first.owners["q"].state.jobs) == 1
            assert rec.debounce_first_at is not None
            assert rec.ready_at <= rec.debounce_first_at + 7200.0
        second = Istos(storage=storage_factory(), zenoh=configs[2], prefix=prefix, node_id="o2")
        second.queue("q")
        async with second.serving():
            late = await producer.enqueue("q", 5, **burst)  # the burst is still open
            assert late == jid and not late.created
            assert await producer.update("q", jid, run_at=time.time() - 1) == "updated"
            events = await wait_events(second, lambda ev: count(ev, "acked", jid) == 1, 30.0)
            assert count(events, "enqueued") == 0
            after = await producer.enqueue("q", 6, **{**burst, "debounce_s": 0.0})
            assert after.created and after != jid  # the burst ran: a new one
            await wait_events(second, lambda ev: count(ev, "acked", after) == 1, 30.0)
    assert runs == [5, 6]  # one run per burst, with the burst's last data across the restart
