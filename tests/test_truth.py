"""Issue 25 on the in-process mesh: resubmit (the ``requeue`` op) is idempotent, short id
prefixes resolve, the owner's series agree with its counts, and queues answer independently."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import app_on, wait_events

from istos import Istos, JobContext
from istos.transport.local import LocalMesh

pytestmark = pytest.mark.fast  # `make check`: no process, server or session


async def _dead_job(mesh: LocalMesh) -> tuple[Istos, Istos, str]:
    owner = app_on(mesh, "owner")
    owner.queue("q", max_attempts=1, admin=True)

    @owner.worker("q", concurrency=1, poll_interval_s=0.05)
    async def work(job: dict[str, Any], ctx: JobContext) -> None:
        if job.get("fail"):
            raise RuntimeError("poison")

    client = app_on(mesh, "client")
    await owner.start()
    await client.start()
    job_id = await owner.enqueue("q", {"fail": True})
    await wait_events(owner, lambda es: any(e.kind == "dead_lettered" for e in es))
    return owner, client, job_id


async def test_resubmitting_a_dead_job_twice_makes_one_job():
    mesh = LocalMesh()
    owner, client, dead_id = await _dead_job(mesh)
    try:
        first, second = await asyncio.gather(
            client.client("q").call("requeue", job_id=dead_id),
            client.client("q").call("requeue", job_id=dead_id))
        again = await client.client("q").call("requeue", job_id=dead_id)
        ids = {first["job_id"], second["job_id"], again["job_id"]}
        assert len(ids) == 1 and dead_id not in ids
        assert sorted([first["status"], second["status"]]) == ["already_requeued", "requeued"]
        assert again["status"] == "already_requeued"
        enqueued = [e for e in owner.events.recent() if e.kind == "enqueued"]
        assert len(enqueued) == 2  # the poison job, and its one resubmit
    finally:
        await client.stop()
        await owner.stop()


async def test_the_old_name_of_revive_warns_and_still_revives():
    mesh = LocalMesh()
    owner, client, dead_id = await _dead_job(mesh)
    try:
        with pytest.warns(DeprecationWarning, match="use revive"):
            revived = client.requeue_dead("q", dead_id)  # warns at the call, not the await
        assert await revived == dead_id
        await wait_events(owner, lambda es: [e.kind for e in es if e.job_id == dead_id].count(
            "dead_lettered") == 2)  # back under its own id: it ran (and died) once more
        assert await client.revive("q", dead_id) == dead_id  # the new name
    finally:
        await client.stop()
        await owner.stop()


def test_series_buckets_are_dense_bounded_and_their_quantiles_close():
    from istos.core import series as S
    from istos.events import JobEvent

    ready = {f"j{i}": 100.0 for i in range(50)}
    s = S.Series(ready.get)
    counts = {"ready": 50}
    for i in range(50):
        s.observe(JobEvent(100.0 + i * 0.01, "n", "q", f"j{i}", "enqueued"))
    s.mark_counts(100.5, counts)
    for i in range(50):  # claimed after waiting 1..50 s, run for 0.5 s
        counts = {"ready": 49 - i, "leased": 1}
        s.observe(JobEvent(101.0 + i, "n", "q", f"j{i}", "claimed"))
        s.mark_counts(101.0 + i, counts)
        s.observe(JobEvent(101.5 + i, "n", "q", f"j{i}", "acked"))
        s.mark_counts(101.5 + i, {"ready": 49 - i})
    rows = list(s.rows(None, 200.0, S.FINE_S))
    assert [r["t"] for r in rows] == [float(t) for t in range(100, 201)]  # dense, to "now"
    assert rows[0]["enqueued"] == 50 and rows[0]["ready"] == 50
    assert rows[-1]["ready"] == 0 and rows[-1]["acked"] == 0  # quiet: counts carried forward
    assert sum(r["acked"] for r in rows) == 50
    minute = list(s.rows(None, 200.0, S.COARSE_S))
    assert [r["t"] for r in minute] == [60.0, 120.0, 180.0]
    assert sum(r["claimed"] for r in minute) == 50
    waits = [r["wait_p50_s"] for r in minute if r["wait_p50_s"] is not None]
    exact = sorted(1.0 + i for i in range(50) if 101.0 + i < 120)  # the first minute's
    assert abs(waits[0] - exact[len(exact) // 2]) / exact[len(exact) // 2] < 0.1
    runs = [r["run_p99_s"] for r in minute if r["run_p99_s"] is not None]
    assert len(runs) == 2 and all(abs(r - 0.5) / 0.5 < 0.1 for r in runs)
    for _ in range(2 * S.FINE_N):  # bounded: the ring forgets the oldest buckets
        s.observe(JobEvent(1000.0 + _, "n", "q", "x", "enqueued"))
    assert len(list(s.rows(None, 1000.0 + 2 * S.FINE_N, S.FINE_S))) <= S.FINE_N + 1


async def test_the_owner_series_agrees_with_its_stats_while_a_backlog_drains():
    mesh = LocalMesh()
    owner = app_on(mesh, "owner")
    owner.queue("q")
    client = app_on(mesh, "client")
    release = asyncio.Event()

    @owner.worker("q", concurrency=4, poll_interval_s=0.05)
    async def work(job: dict[str, Any], ctx: JobContext) -> None:
        if job["i"] >= 100:
            await release.wait()

    await owner.start()
    await client.start()
    try:
        await owner.enqueue_many("q", [{"i": i} for i in range(300)])
        await wait_events(owner, lambda es: sum(e.kind == "acked" for e in es) >= 100)
        reply = await client.client("q").call("series")
        stats = owner.owners["q"].stats()["counts"]
        last = reply["rows"][-1]
        assert {k: last[k] for k in stats} == stats  # nothing moves while the workers wait
        assert sum(r["enqueued"] for r in reply["rows"]) == 300
        assert sum(r["acked"] for r in reply["rows"]) == 100
        assert last["t"] <= reply["now"] < last["t"] + 1.0
        assert any(r["wait_p50_s"] is not None for r in reply["rows"])
        minute = await client.client("q").call("series", resolution="1min")
        claimed = sum(r["claimed"] for r in reply["rows"])
        assert sum(r["claimed"] for r in minute["rows"]) == claimed >= 104
        assert last["leased"] == claimed - 100
        release.set()
    finally:
        await client.stop()
        await owner.stop()
