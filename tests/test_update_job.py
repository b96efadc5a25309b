"""Editing a waiting job: ``app.update(name, job_id, data=, delay_s= | run_at=, priority=)``.

Pure state (what may change, the heaps, rollback), the producer's checks, and real Zenoh on
every storage across an owner restart (the edit is durable), on the produce role."""

from __future__ import annotations

import asyncio
import time

import pytest
import test_durable
from helpers import count, wait_events
from zenoh_util import isolated_configs, unique_prefix

from istos import ConfigError, Istos
from istos.core.edit import update_job
from istos.core.state import QueuePolicy, QueueState
from istos.protocol import role_of
from istos.transport.local import LocalMesh

storage_factory = test_durable.storage_factory  # memory, Redis, PostgreSQL, SQLite


@pytest.mark.fast
def test_pure_update_moves_a_job_between_ready_and_delayed_and_reorders():
    state = QueueState("q", QueuePolicy())
    state.enqueue("a", b"1", 0.0)
    state.enqueue("b", b"2", 0.0)
    assert update_job(state, "b", 1.0, priority=5, body=b"22") == "updated"
    assert update_job(state, "a", 1.0, ready_at=100.0) == "updated"
    assert state.jobs["a"].state == "delayed" and state.counts["delayed"] == 1
    (first,) = state.claim(["w"], 2.0)
    assert first.job_id == "b" and first.body == b"22"
    assert state.claim(["w"], 3.0) == []  # a waits till t=100
    assert update_job(state, "a", 4.0, ready_at=0.0) == "updated"  # past: ready now
    (second,) = state.claim(["w"], 4.0)
    assert second.job_id == "a"
    assert update_job(state, "a", 5.0, priority=1) == "too_late"
    assert update_job(state, "nope", 5.0, priority=1) == "unknown"
    kinds = [e.kind for e in state.drain()[1]]
    assert kinds.count("updated") == 3
    assert state.jobs["b"].edits == 1 and state.jobs["a"].edits == 2


@pytest.mark.fast
def test_pure_failed_write_puts_the_job_back_as_it_was():
    state = QueueState("q", QueuePolicy())
    state.track_undo()
    state.enqueue("a", b"1", 0.0)
    state.drain(), state.take_undo()
    assert update_job(state, "a", 1.0, body=b"new", priority=9, ready_at=50.0) == "updated"
    state.rollback(state.take_undo())
    rec = state.jobs["a"]
    assert (rec.body, rec.priority, rec.state, rec.edits) == (b"1", 0, "ready", None)
    assert state.counts["ready"] == 1 and state.counts["delayed"] == 0
    assert state.claim(["w"], 2.0)[0].job_id == "a"


@pytest.mark.fast
def test_update_travels_on_the_produce_role():
    assert role_of("update") == "produce"


def test_producer_checks_update_before_sending():
    app = Istos(transport=LocalMesh().transport("p"))
    for kw, field in (({}, "update needs"), ({"delay_s": -1}, "delay_s"),
                      ({"delay_s": 1, "run_at": 5.0}, "not both"),
                      ({"run_at": float("nan")}, "run_at"), ({"priority": 1.5}, "priority")):
        with pytest.raises(ConfigError, match=field):
            asyncio.run(app.update("q", "a", **kw))
    with pytest.raises(ConfigError, match="job_id"):
        asyncio.run(app.update("q", "", priority=1))


async def test_update_over_zenoh_on_every_storage_survives_a_restart(storage_factory):
    configs, prefix = isolated_configs(3), unique_prefix()
    first = Istos(storage=storage_factory(), zenoh=configs[0], prefix=prefix, node_id="o1")
    first.queue("q", keep_results=True)
    producer = Istos(zenoh=configs[1], prefix=prefix, node_id="p")
    runs: list[dict] = []

    @producer.worker("q", poll_interval_s=0.1)
    async def handle(job):
        runs.append(job)
        return job["v"]

    async with producer.serving():
        async with first.serving():
            jid = await producer.enqueue("q", {"v": 1}, delay_s=3600)
            assert await producer.update("q", jid, data={"v": 2}, priority=3) == "updated"
            assert await producer.update("q", "no-such-job", priority=3) == "unknown"
            why = first.owners["q"].state.jobs[jid]
            assert why.edits == 1 and why.priority == 3 and why.state == "delayed"
        second = Istos(storage=storage_factory(), zenoh=configs[2], prefix=prefix, node_id="o2")
        second.queue("q", keep_results=True)

        async with second.serving():
            rec = second.owners["q"].state.jobs[jid]  # reloaded as edited
            assert rec.body and rec.priority == 3 and rec.edits == 1
            assert await producer.update("q", jid, run_at=time.time() - 1) == "updated"
            events = await wait_events(second, lambda ev: count(ev, "acked", jid) == 1, 30.0)
            assert count(events, "updated", jid) == 1
            assert await producer.update("q", jid, data={"v": 3}) == "too_late"
            assert (await producer.result("q", jid))["result"] == 2
    assert runs == [{"v": 2}]


async def test_why_shows_the_unique_key_the_burst_and_the_edits():
    from istos.ops.render import why_text
    from istos.owner.views.inspect import explain

    owner = Istos(transport=LocalMesh().transport("o"))
    owner.queue("q")
    async with owner.serving():
        jid = await owner.enqueue("q", 1, unique_key="feed:1", unique="queued", delay_s=60)
        assert await owner.update("q", jid, delay_s=120) == "updated"
        burst = await owner.enqueue("q", 2, debounce_key="d", debounce_s=60)
        why = explain(owner.owners["q"], jid)
        assert (why["unique_key"], why["unique"], why["edits"]) == ("feed:1", "queued", 1)
        text = why_text(jid, why)
        assert "unique key: feed:1 (queued)" in text and "edited 1 time(s)" in text
        assert "debounce key: d" in why_text(burst, explain(owner.owners["q"], burst))


def test_frames_follow_an_edited_start():
    import pandas as pd

    from istos_nb.data.frames import depth_frame, jobs_frame

    state = QueueState("q", QueuePolicy())
    state.enqueue("a", b"1", 0.0, delay_s=100.0)
    update_job(state, "a", 1.0, ready_at=0.0)  # ready at once
    state.enqueue("b", b"2", 2.0)
    update_job(state, "b", 3.0, ready_at=50.0)  # delayed till t=50
    events = [e.to_dict() for e in state.drain()[1]]
    jobs = jobs_frame(pd.DataFrame(events)).set_index("job_id")
    assert jobs.loc["a", "state"] == "ready" and jobs.loc["b", "state"] == "delayed"
    depth = depth_frame(pd.DataFrame(events))
    assert depth.iloc[-1][["ready", "delayed"]].tolist() == [1, 1]
