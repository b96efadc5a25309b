"""Job logs: ``ctx.log(message)`` lines ride on the next heartbeat or the ack/nack and are kept
with the attempt (history, dead letters, ``why``, ``istos why``, ``LiveQueue.job()``). Bounds,
in-process with heartbeats, every storage across a restart, real Zenoh, the simulator."""

from __future__ import annotations

import asyncio

import pandas as pd
import test_durable
from helpers import count, wait_events
from zenoh_util import isolated_configs, unique_prefix

from istos import Istos, JobContext
from istos.core.joblogs import MAX_LINE_BYTES, MAX_LINES, record_logs
from istos.core.state import QueuePolicy, QueueState
from istos.ops.render import why_text
from istos.transport.local import LocalMesh
from istos_nb.attach import aattach
from istos_nb.sim import Simulation
from istos_nb.views.livetables import detail_html

storage_factory = test_durable.storage_factory  # the fixture: memory, Redis, PostgreSQL, SQLite


def test_ctx_log_bounds_lines_and_counts_the_rest():
    ctx = JobContext("j", "q", 1, 3)
    for i in range(MAX_LINES + 7):
        ctx.log(f"line {i}")
    ctx.log("é" * 2000)  # dropped: past the count (and it would be cut)
    lines, dropped = ctx._signals.take_logs()
    assert len(lines) == MAX_LINES and lines[0] == "line 0" and dropped == 8
    fresh = JobContext("k", "q", 1, 3)
    fresh.log("é" * 2000)
    fresh.log(42)
    (long, num), _ = fresh._signals.take_logs()
    assert len(long.encode()) <= MAX_LINE_BYTES and long.endswith("...") and num == "42"


def test_owner_bounds_what_arrives_whatever_the_sender():
    state = QueueState("q", QueuePolicy())
    state.enqueue("j", b"x", 0.0)
    (rec,) = state.claim(["w"], 0.0)
    assert record_logs(rec, ["a"] * 150 + [7, None], 3)
    attempt = rec.history[-1]
    assert attempt.logs == ["a"] * MAX_LINES and attempt.logs_dropped == 53
    assert not record_logs(rec, "not a list", "x")
    assert attempt.to_dict()["logs_dropped"] == 53
    state.enqueue("k", b"x", 0.0)
    (other,) = state.claim(["w"], 0.0)
    assert "logs" not in other.history[-1].to_dict()  # nothing written: the entry as before


async def test_logs_ride_on_heartbeats_and_the_nack_into_the_dead_letter():
    mesh = LocalMesh()
    owner = Istos(transport=mesh.transport("owner"))
    owner.queue("q", lease_s=0.6, max_attempts=2, retry_backoff_s=0.0, retry_backoff_max_s=0.0)
    worker = Istos(transport=mesh.transport("w"))
    step = asyncio.Event()

    @worker.worker("q", heartbeat=True)
    async def handle(job, ctx: JobContext):
        ctx.log(f"attempt {ctx.attempt}: calling the API")
        if ctx.attempt == 1:
            await step.wait()  # the owner must see the line before this run ends
            raise RuntimeError("502")
        ctx.log("gave up")
        raise RuntimeError("503")

    async with owner.serving(), worker.serving():
        jid = await owner.enqueue("q", {"n": 1})

        async def logged() -> None:
            while True:  # heartbeats every lease_s / 3 carry the line
                why = (await owner.client("q").call("why", job_id=jid))["why"]
                hist = why["job"].get("history") or []
                if hist and hist[-1].get("logs"):
                    return
                await asyncio.sleep(0.05)

        await asyncio.wait_for(logged(), 10.0)
        step.set()
        await wait_events(owner, lambda ev: count(ev, "dead_lettered", jid) == 1, 10.0)
        (dead,) = await owner.dead_letters("q")
        why = (await owner.client("q").call("why", job_id=jid))["why"]
    assert [h.get("logs") for h in dead["history"]] == [
        ["attempt 1: calling the API"], ["attempt 2: calling the API", "gave up"]]
    text = why_text(jid, why)
    assert "log of attempt 2:" in text and "    gave up" in text


async def test_logs_kept_on_every_storage_across_a_restart(storage_factory):
    mesh = LocalMesh()
    owner = Istos(storage=storage_factory(), transport=mesh.transport("owner"))
    owner.queue("q", max_attempts=1)
    worker = Istos(transport=mesh.transport("w"))

    @worker.worker("q")
    def handle(job, ctx: JobContext):  # a thread worker: ctx.log is plain and synchronous
        for i in range(3):
            ctx.log(f"step {i}")
        raise ValueError("bad input")

    async with worker.serving():
        async with owner.serving():
            jid = await owner.enqueue("q", 1)
            await wait_events(owner, lambda ev: count(ev, "dead_lettered", jid) == 1, 20.0)
        if not owner.node.storage.durable:
            return
        again = Istos(storage=storage_factory(), transport=mesh.transport("owner-2"))
        again.queue("q", max_attempts=1)
        async with again.serving():
            (dead,) = await again.dead_letters("q")
    assert dead["history"][0]["logs"] == ["step 0", "step 1", "step 2"]


async def test_live_queue_job_shows_the_logs_over_zenoh():
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q", keep_results=True)
    worker = Istos(zenoh=configs[1], prefix=prefix, node_id="w")

    @worker.worker("q", poll_interval_s=0.2)
    async def handle(job, ctx: JobContext):
        ctx.log("fetched 3 rows")
        ctx.log("wrote the report")
        return "ok"

    async with owner.serving(), worker.serving():
        jid = await owner.enqueue("q", 1)
        await wait_events(owner, lambda ev: count(ev, "acked", jid) == 1, 30.0)
        lq = await aattach("q", configs[2], prefix=prefix)
        try:
            detail = await lq.ajob(jid)
        finally:
            await lq.aclose()
    assert detail["logs"] == [{"attempt": 1, "line": "fetched 3 rows"},
                              {"attempt": 1, "line": "wrote the report"}]
    html = detail_html(detail, pd.Timestamp.now(tz="UTC"))  # the dashboard's job detail
    assert "log (2 line(s))" in html and "[1] wrote the report" in html


def test_simulated_logs_reach_the_dead_letters():
    sim = Simulation(seed=2)
    owner = sim.node("owner")
    owner.queue("q", max_attempts=2, retry_backoff_s=1.0)
    w = sim.node("w")
    seen: list = []

    @w.worker("q", heartbeat=True)
    async def handle(job, ctx: JobContext):
        ctx.log(f"try {ctx.attempt}")
        await asyncio.sleep(20.0)  # several heartbeats of a 30 s lease
        raise RuntimeError("upstream down")

    async def collect() -> None:
        seen.extend(await owner.dead_letters("q"))

    sim.enqueue_jobs("owner", "q", 3)
    sim.at(200.0, collect)
    result = sim.run(until=210.0)
    assert result.check()["ok"].all()
    assert len(seen) == 3
    assert all([h["logs"] for h in d["history"]] == [["try 1"], ["try 2"]] for d in seen)
