"""Attach works in every context, over real Zenoh on loopback: plain calls on the very loop that
serves the owner (a notebook's ``await app.start()``), in a real Jupyter kernel, from a thread
and from a script; the ``a``-prefixed twins never block the caller's loop. Also what the frames
and dicts hold: UTC instants, Timedeltas, relative reasons, paging attrs, policy, job detail.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import threading
import time
from pathlib import Path
from typing import Any

import nbformat
import pandas as pd
import pytest
from helpers import count, wait_events
from kernels import notebook_client, private_kernel_env
from zenoh_util import isolated_configs, unique_prefix, wait_until

from istos import Istos, JobContext, OwnerUnavailable, codec
from istos_nb import LiveQueue, aattach, attach
from istos_nb.live.reenter import can_reenter, wait_running_loop

REPO = Path(__file__).resolve().parents[1]
CALL_TIMEOUT_S = 30.0  # long, so a call that waits for its timeout cannot pass for an answer


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - started


async def test_plain_calls_on_the_loop_that_serves_the_owner_answer_within_1s():
    configs, prefix = isolated_configs(2), unique_prefix()
    app = Istos(zenoh=configs[0], prefix=prefix, node_id="kernel-owner")
    app.queue("jobs/email", lease_s=4.0, max_attempts=3, retry_backoff_s=0.5,
              retry_backoff_max_s=2.0, retry_jitter=0.2)
    await app.start()  # what a notebook cell does: the owner now lives on this loop
    try:
        ids = [await app.enqueue("jobs/email", {"to": f"u{i}@x"}) for i in range(3)]
        # A call that waited for its timeout instead of being answered would take 30 s:
        # well apart from an answer's milliseconds, whatever the machine's load.
        lq = attach("jobs/email", configs[1], prefix=prefix, timeout_s=CALL_TIMEOUT_S)
        try:
            assert lq.owner_node == "kernel-owner"
            for call in (lq.stats, lq.jobs, lq.leases, lq.dead_letters, lq.events,
                         lambda: lq.why(ids[0]), lambda: lq.job(ids[1])):
                _, took = timed(call)
                assert took < CALL_TIMEOUT_S / 2, f"{call} waited {took:.2f} s for its timeout"
            assert lq.stats()["counts"]["ready"] == 3
            assert "unavailable" not in repr(lq) and "ready=3" in repr(lq)
            lq.follow()
            jid = await app.enqueue("jobs/email", {"late": 1})
            # The owner publishes from this loop; the window fills as the stream arrives.
            await wait_until(lambda: bool((lq.events().job_id == jid).any()),
                             what="the enqueue streamed")
        finally:
            lq.close()
        # attach() handed to a thread, then plain calls on the loop (the third case).
        lq = await asyncio.to_thread(attach, "jobs/email", configs[1], prefix=prefix,
                                     timeout_s=CALL_TIMEOUT_S)
        try:
            stats, took = timed(lq.stats)
            assert took < CALL_TIMEOUT_S / 2 and stats["counts"]["ready"] == 4
            assert "unavailable" not in repr(lq)
        finally:
            lq.close()
    finally:
        await app.stop()


async def test_inside_serving_and_from_a_thread_and_the_async_twins():
    configs, prefix = isolated_configs(2), unique_prefix()
    app = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    app.queue("q")
    async with app.serving():
        await app.enqueue("q", {"n": 1})
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.005)

        ticking = asyncio.get_running_loop().create_task(ticker())
        lq = await aattach("q", configs[1], prefix=prefix)
        try:
            before = ticks
            stats = await lq.astats()
            assert stats["counts"]["ready"] == 1
            frames = await asyncio.gather(lq.ajobs(), lq.aleases(), lq.adead_letters(),
                                          lq.aevents())
            assert [len(f) for f in frames[:3]] == [1, 0, 0]
            assert (frames[3].kind == "enqueued").sum() == 1
            job_id = frames[0].job_id[0]
            assert (await lq.awhy(job_id))["state"] == "ready"
            assert (await lq.ajob(job_id))["data"] == {"n": 1}
            await lq.afollow()
            assert lq.following
            await lq.aunfollow()
            assert ticks > before  # the loop kept running while the twins waited

            # A plain call inside `async with app.serving()` also lets the loop run.
            before = ticks
            assert lq.stats()["counts"]["ready"] == 1
            # From another thread (the loop is free: it awaits the thread).
            got: dict[str, Any] = {}
            thread = threading.Thread(target=lambda: got.update(lq.stats()))
            thread.start()
            await asyncio.to_thread(thread.join, 10)
            assert got["counts"]["ready"] == 1
        finally:
            ticking.cancel()
            await lq.aclose()
        with pytest.raises(OwnerUnavailable):
            await aattach("nobody", configs[1], prefix=prefix, timeout_s=0.3)


def test_plain_calls_from_a_script_without_any_loop():
    configs, prefix = isolated_configs(2), unique_prefix()
    ready, stop = threading.Event(), threading.Event()
    app = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    app.queue("q")

    async def serve() -> None:
        async with app.serving():
            await app.enqueue("q", {"n": 1})
            ready.set()
            await asyncio.to_thread(stop.wait, 30)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    try:
        assert ready.wait(15)
        with attach("q", configs[1], prefix=prefix) as lq:
            assert lq.stats()["counts"]["ready"] == 1
            assert lq.jobs().data[0] == {"n": 1}
    finally:
        stop.set()
        thread.join(15)


@pytest.mark.timeout(120)
def test_a_real_jupyter_kernel_owner_and_attach_in_the_next_cell(tmp_path, monkeypatch):
    """The issue's first case, in a real ipykernel: `await app.start()` in one cell, a plain
    `istos_nb.attach(...)` and plain calls in the next."""
    private_kernel_env(tmp_path, monkeypatch)
    configs, prefix = isolated_configs(2), unique_prefix()
    cells = [
        "import json, time, istos_nb\nfrom istos import Istos\n"
        f"app = Istos(zenoh=json.loads({json.dumps(json.dumps(configs[0]))}), "
        f"prefix={prefix!r}, node_id='kernel')\n"
        "app.queue('jobs/email', retry_backoff_s=0.5, retry_backoff_max_s=2.0, max_attempts=3)\n"
        "await app.start()\n"
        "jid = await app.enqueue('jobs/email', {'to': 'a@b'})",
        f"t0 = time.perf_counter()\nq = istos_nb.attach('jobs/email', "
        f"json.loads({json.dumps(json.dumps(configs[1]))}), prefix={prefix!r}, "
        f"timeout_s={CALL_TIMEOUT_S})\n"
        "s = q.stats()\nj = q.jobs()\nw = q.why(jid)\nr = repr(q)\n"
        "took = time.perf_counter() - t0\n"
        "print(json.dumps({'ready': s['counts']['ready'], 'policy': s['policy'], "
        "'n': len(j), 'dtype': str(j.enqueued_at.dtype), 'state': w['state'], "
        "'repr': r, 'took': took}))",
        "q.close()\nawait app.stop()",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    notebook_client(nb, tmp_path, timeout=60, cwd=tmp_path).execute()
    out = json.loads(nb.cells[1].outputs[0]["text"])
    assert out["ready"] == 1 and out["n"] == 1 and out["state"] == "ready"
    assert out["policy"]["retry_backoff_s"] == 0.5 and out["policy"]["max_attempts"] == 3
    assert out["dtype"] == "datetime64[ns, UTC]" or out["dtype"].endswith(", UTC]")
    assert "unavailable" not in out["repr"]
    # Opening the session included: no call waited for its (30 s) timeout.
    assert out["took"] < CALL_TIMEOUT_S / 2


async def test_a_blocking_wait_keeps_the_running_loop_going_and_leaves_it_sound():
    loop = asyncio.get_running_loop()
    assert can_reenter(loop)
    fut: concurrent.futures.Future[str] = concurrent.futures.Future()
    order: list[str] = []

    async def answer() -> None:  # needs this loop to run: a timer, then a task step
        await asyncio.sleep(0.02)
        order.append("answered")
        fut.set_result("ok")

    task = loop.create_task(answer())
    for i in range(3):  # handles already queued when the blocking call starts
        loop.call_soon(order.append, f"queued{i}")
    assert wait_running_loop(loop, fut, 5.0) == "ok"  # synchronous, on the loop's thread
    assert order[-1] == "answered" and task.done()
    assert asyncio.current_task() is not None  # the caller's task is current again
    with pytest.raises(concurrent.futures.TimeoutError):
        wait_running_loop(loop, concurrent.futures.Future(), 0.05)
    await asyncio.sleep(0)  # the outer loop carries on (nothing left it an empty batch)


# -- what comes back -----------------------------------------------------------------------------
async def test_frames_policy_paging_and_job_detail():
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q", lease_s=5.0, max_attempts=2, retry_backoff_s=0.5, retry_backoff_max_s=2.0,
                retry_jitter=0.0, admin=True)
    worker = Istos(zenoh=configs[2], prefix=prefix, node_id="wk")
    release = asyncio.Event()

    @worker.worker("q", concurrency=2, poll_interval_s=0.1)
    async def work(job: dict, ctx: JobContext) -> None:
        if job.get("fail"):
            raise RuntimeError("boom")
        if job.get("i") == 0:
            await release.wait()

    async with owner.serving():
        lq = await aattach("q", configs[1], prefix=prefix)
        try:
            stats = await lq.astats()
            assert stats["policy"] == {
                "lease_s": 5.0, "max_attempts": 2, "retry_backoff_s": 0.5,
                "retry_backoff_max_s": 2.0, "retry_jitter": 0.0, "keep_results": False,
                "result_ttl_s": 3600.0, "admin": True}
            dead_id = await owner.enqueue("q", {"fail": 1}, priority=5)
            ids = [await owner.enqueue("q", {"i": i}) for i in range(12)]

            page = await lq.ajobs(limit=5)
            assert len(page) == 5 and page.attrs["truncated"] is True
            assert page.attrs["total"] == 13
            everything = await lq.ajobs(limit=None)
            assert len(everything) == 13 and everything.attrs["truncated"] is False
            assert everything.attrs["total"] == 13
            exact = await lq.ajobs(limit=13)
            assert exact.attrs["truncated"] is False and exact.attrs["total"] == 13
            found = await lq.ajobs(where={"i": 3})
            assert found.job_id.tolist() == [ids[3]] and found.attrs["total"] == 1
            for name in ("enqueued_at", "ready_at", "deadline"):
                assert str(page[name].dtype) == "datetime64[ns, UTC]", name
            age = pd.Timestamp.now(tz="UTC") - page.enqueued_at[0]
            assert pd.Timedelta(0) <= age < pd.Timedelta(minutes=1)

            async with worker.serving():
                await wait_events(owner, lambda ev: count(ev, "dead_lettered", dead_id) == 1
                                  and count(ev, "acked") == 11)  # all but the held one
                leases = await lq.aleases()
                assert str(leases.deadline.dtype) == "datetime64[ns, UTC]"
                held = leases.job_id[0]
                assert leases.job_id.tolist() == [ids[0]]
                why = await lq.awhy(held)
                assert why["reason"].startswith("leased by wk:") and "s more" in why["reason"]
                assert isinstance(why["until"], pd.Timestamp) and why["until"].tz is not None
                not_done = await lq.ajobs(state=["ready", "leased", "delayed", "dead"],
                                          limit=200)
                assert sorted(not_done.job_id) == sorted([ids[0], dead_id])
                assert not_done.attrs["total"] == 2
                assert not_done.enqueued_at.is_monotonic_increasing  # oldest first

                dead = await lq.adead_letters()
                assert str(dead.finished_at.dtype) == "datetime64[ns, UTC]"
                assert [type(a["claimed_at"]) for a in dead.history[0]] == [pd.Timestamp] * 2
                why = await lq.awhy(dead_id)
                assert "dead since" in why["reason"] and "boom" in why["reason"]
                assert isinstance(why["dead_letter"]["finished_at"], pd.Timestamp)

                detail = await lq.ajob(dead_id)
                assert detail["state"] == "dead" and detail["data"] == {"fail": 1}
                assert detail["record"]["priority"] == 5
                attempts = detail["attempts"]
                assert attempts.attempt.tolist() == [1, 2]
                assert attempts.outcome.tolist() == ["nacked", "nacked"]
                assert str(attempts.claimed_at.dtype) == "datetime64[ns, UTC]"
                assert attempts.backoff[0] == pd.Timedelta(seconds=0.5)
                with pytest.raises(LookupError, match="no job 'nope'"):
                    await lq.ajob("nope")

                events = await lq.aevents()
                assert str(events.t.dtype) == "datetime64[ns, UTC]"
                assert str(events.delay_s.dtype).startswith("timedelta64")
                release.set()
        finally:
            await lq.aclose()


def test_the_package_exports_the_dashboards_and_the_twins():
    import istos_nb

    assert istos_nb.LiveQueue is LiveQueue
    from istos_nb.views.widgets import LiveDashboard, SimDashboard

    assert istos_nb.LiveDashboard is LiveDashboard and istos_nb.SimDashboard is SimDashboard
    from istos_nb.live.overview import aqueues, queues

    assert istos_nb.queues is queues and istos_nb.aqueues is aqueues
    for name in ("stats", "jobs", "job", "why", "leases", "dead_letters", "events", "follow",
                 "unfollow", "resubmit", "purge_dead", "pause", "resume", "close", "workers",
                 "redrive_dead", "promote"):
        assert asyncio.iscoroutinefunction(getattr(LiveQueue, "a" + name)), name


async def test_why_and_job_of_a_dead_job_with_a_near_maximal_body_fit_one_reply():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q", max_attempts=1)

    @owner.worker("q", concurrency=1, poll_interval_s=0.1)
    async def work(job: dict, ctx: JobContext) -> None:
        raise RuntimeError("too big to send")

    async with owner.serving():
        big = {"blob": "x" * (codec.MAX_BODY_BYTES - 1024)}  # the body travels once per reply
        job_id = await owner.enqueue("q", big)
        await wait_events(owner, lambda ev: count(ev, "dead_lettered", job_id) == 1)
        lq = await aattach("q", configs[1], prefix=prefix)
        try:
            why = await lq.awhy(job_id)
            assert why["state"] == "dead" and why["dead_letter"]["data"] == big
            detail = await lq.ajob(job_id)
            assert detail["data"] == big and detail["attempts"].outcome.tolist() == ["nacked"]
            assert isinstance(why["dead_letter"]["history"][0]["claimed_at"], pd.Timestamp)
        finally:
            await lq.aclose()
