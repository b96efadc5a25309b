"""Job logs: ``ctx.log(message)`` lines ride on the next heartbeat or the ack/nack and are kept
with the attempt (history, dead letters, ``why``, ``istos why``, ``LiveQueue.job()``). Bounds,
in-process with heartbeats, every storage across a restart, real Zenoh, the simulator."""

from __future__ import annotations

import asyncio

import pandas as pd
import pytest
import test_durable
from helpers import count, wait_events
from zenoh_util import isolated_configs, unique_prefix

from istos import Istos, JobContext
from istos.clock import ManualClock
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
    at, lines, dropped = ctx._signals.pending_logs()
    assert at == 0 and len(lines) == MAX_LINES and lines[0] == "line 0" and dropped == 8
    fresh = JobContext("k", "q", 1, 3)
    fresh.log("é" * 2000)
    fresh.log(42)
    _, (long, num), _ = fresh._signals.pending_logs()
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
    # Leases are read on a clock that stands still (heartbeats still go every lease_s / 3 of
    # the loop's time): on the loop's clock a loaded machine could delay a heartbeat past the
    # 0.6 s lease and expire attempt 1 before its line was seen.
    mesh, clock = LocalMesh(), ManualClock()
    owner = Istos(transport=mesh.transport("owner"), clock=clock)
    owner.queue("q", lease_s=0.6, max_attempts=2, retry_backoff_s=0.0, retry_backoff_max_s=0.0)
    worker = Istos(transport=mesh.transport("w"), clock=clock)
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


def test_owner_skips_resent_lines_by_their_index():
    state = QueueState("q", QueuePolicy())
    state.enqueue("j", b"x", 0.0)
    (rec,) = state.claim(["w"], 0.0)
    assert record_logs(rec, ["a", "b"], 0, 0)  # a heartbeat whose reply was lost...
    assert record_logs(rec, ["a", "b", "c"], 0, 0)  # ...so the ack sends them all again
    assert not record_logs(rec, ["b", "c"], 0, 1)  # nothing new
    attempt = rec.history[-1]
    assert attempt.logs == ["a", "b", "c"] and not attempt.logs_dropped
    full = [f"l{i}" for i in range(MAX_LINES)]
    assert record_logs(rec, full, 5, 0) and record_logs(rec, full[90:], 5, 90) is False
    assert len(attempt.logs) == MAX_LINES and attempt.logs_dropped == 5  # a total, not added


def _logging_run(seed: int, storage: str = "volatile"):
    """Heart-beating and plain workers whose every attempt logs past both caps (130 lines of
    1,100 bytes), on a lossy network with crashes, a freeze and lost acks (and, on durable
    storage, an owner restart: the kept logs are read back from storage)."""
    sim = Simulation(seed=seed, storage=storage, latency_s=(0.001, 0.01), loss=0.05)
    sim.node("owner").queue("q", lease_s=6, max_attempts=4, retry_backoff_s=0.5,
                            keep_results=True)
    for i in range(3):
        sim.node(f"w{i}").worker("q", concurrency=2, heartbeat=i > 0)(sim.handler(
            service_s=("exp", 3.0), fail_p=0.2, crash_p=0.05, log_lines=130,
            log_line_bytes=1100))
    sim.enqueue_jobs("owner", "q", 80, rate=1.0)
    sim.crash_randomly(["w0", "w1"], mtbf_s=60, restart_after=5)
    sim.freeze("w2", at=40.0, resume_at=55.0)
    sim.lose_acks(0.05)
    if storage == "durable":
        sim.restart("owner", at=100.0)
    return sim.run(until=200.0, progress=None)


# (seed 0 kept lines twice, or lost those of a heartbeat crossing the ack, before the fix)
@pytest.mark.parametrize("storage, seed", [("volatile", 0), ("durable", 3)])
def test_simulated_logs_over_the_caps_match_what_the_handlers_wrote(storage, seed):
    result = _logging_run(seed, storage)
    report = result.check().set_index("invariant")
    assert report["ok"].all(), report[~report["ok"]]
    detail = report.loc["job logs kept as their attempts wrote them", "detail"]
    assert detail.endswith("match what was written") and int(detail.split()[0]) > 60
    kept = result.kept_logs
    assert all(len(k["logs"]) <= MAX_LINES for k in kept)
    assert any(k["logs_dropped"] == 30 and k["outcome"] in ("acked", "nacked") for k in kept)
    assert any(k["logs"] and k["logs"][0].endswith("...") for k in kept)  # cut to 1 KiB
    assert {(r["attempt"], len(r["lines"])) for r in result.logs} >= {(1, 130)}


def test_the_job_log_check_finds_planted_reordered_oversized_and_missing_lines():
    from istos_nb.sim.checker import RunRecord, check

    name = "job logs kept as their attempts wrote them"
    ledger = [{"job_id": "j", "queue": "q", "attempt": 1, "node": "w", "t": 0.0,
               "lines": ["one", "two", "three"]}]
    acked = [{"kind": "acked", "queue": "q", "job_id": "j", "attempt": 1, "node": "o",
              "t": 1.0, "t_node": 1.0, "worker": "w:0", "detail": {}}]

    def finding(logs: list[str], dropped: int = 0, events=acked, attempt: int = 1) -> str:
        kept = [{"queue": "q", "job_id": "j", "attempt": attempt, "outcome": "acked",
                 "logs": logs, "logs_dropped": dropped}]
        rec = RunRecord(events=events, attempts=[], effects=[], queues={}, held=set(),
                        volatile=True, logs=ledger, kept_logs=kept)
        (f,) = [f for f in check(rec) if f.invariant == name]
        return "ok" if f.ok else f.detail

    assert finding(["one", "two", "three"]) == "ok"
    assert "not written by that attempt" in finding(["one", "planted", "three"])
    assert "wrote none" in finding(["one"], attempt=2)  # kept for an attempt that wrote none
    assert "out of order" in finding(["two", "one", "three"])
    assert "out of order" in finding(["one", "one", "two"])  # kept twice
    assert "neither kept nor counted" in finding(["one", "two"])  # settled: none may miss
    assert finding(["one", "two"], events=[]) == "ok"  # expired: a prefix may stay behind
    assert "counted dropped" in finding(["one", "two"], dropped=1)
    assert f"(at most {MAX_LINES})" in finding(["one"] * (MAX_LINES + 1))
    ledger[0]["lines"] = ["é" * 600]
    assert f"(at most {MAX_LINE_BYTES})" in finding(["é" * 600])  # kept uncut: too long
    assert finding(["é" * 510 + "..."]) == "ok"  # cut as the bounds say
    assert "not written" in finding(["è" * 510 + "..."])
    rec = RunRecord(events=[], attempts=[], effects=[], queues={}, held=set(), volatile=True)
    (f,) = [f for f in check(rec) if f.invariant == name]
    assert f.ok and f.detail == "no handler logged"
