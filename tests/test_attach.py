"""istos_nb.live.attach over real Zenoh on loopback: inspection, the live stream, admin ops, OS
processes, and the synchronous API called from inside a running event loop.

Several tests call LiveQueue through ``asyncio.to_thread`` while the owner runs on the test's
own loop (a thread call must work too); plain calls on that loop are tested in
``test_attach_contexts.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import count, wait_events
from zenoh_util import isolated_configs, unique_prefix, wait_until

from istos import AdminDisabled, Istos, IstosError, JobContext, OwnerUnavailable, codec
from istos.owner.extension import Hooks
from istos_nb import LiveQueue, attach

PROCS = Path(__file__).parent / "procs"
JOB_COLUMNS = ["job_id", "state", "priority", "attempts", "enqueued_at", "ready_at", "worker",
               "deadline", "last_error", "data", "progress", "progress_note"]


async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """A LiveQueue call off the test's loop, which serves the owner."""
    return await asyncio.to_thread(fn, *args, **kwargs)


def stream_kinds(lq: LiveQueue) -> Counter[tuple[str, str]]:
    """(job_id, kind) counts in the followed window (local: no request is sent)."""
    df = lq.events(limit=100_000)
    return Counter(zip(df.job_id, df.kind))


async def test_stats_jobs_why_leases_and_follow_in_process():
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("jobs/email", retry_backoff_s=60.0, max_attempts=3)
    worker = Istos(zenoh=configs[2], prefix=prefix, node_id="wk")
    release = asyncio.Event()

    @worker.worker("jobs/email", concurrency=1, poll_interval_s=0.2)
    async def send(job: dict, ctx: JobContext) -> None:
        if job.get("mode") == "fail":
            raise RuntimeError("smtp down")
        if job.get("mode") == "hold":
            await release.wait()

    async with owner.serving():
        lq = await call(attach, "jobs/email", configs[1], prefix=prefix)
        try:
            assert lq.owner_node == "owner"
            stats = await call(lq.stats)
            assert stats["counts"]["ready"] == 0 and stats["totals"]["enqueued"] == 0
            assert stats["admin"] is False and stats["paused"] is False
            bodies = [({"to": "a@b.com", "mode": "fail"}, 2),
                      ({"to": "c@d.com", "mode": "hold"}, 1),
                      ({"to": "e@f.com", "meta": {"k": 1}}, 0), ({"to": "g@h.com"}, 0)]
            ids = [await owner.enqueue("jobs/email", b, priority=p) for b, p in bodies]
            fail_id, hold_id, meta_id, last_id = ids
            stats = await call(lq.stats)
            assert stats["counts"]["ready"] == 4 and stats["totals"]["enqueued"] == 4

            ready = await call(lq.jobs, state="ready")
            assert list(ready.columns) == JOB_COLUMNS and sorted(ready.job_id) == sorted(ids)
            hit = await call(lq.jobs, where={"to": "a@b.com"})
            assert hit.job_id.tolist() == [fail_id] and hit.data[0] == bodies[0][0]
            assert hit.priority[0] == 2 and hit.state[0] == "ready"
            assert (await call(lq.jobs, where={"meta.k": 1})).job_id.tolist() == [meta_id]
            assert len(await call(lq.jobs, limit=2, offset=3)) == 1
            empty = await call(lq.jobs, state="leased")
            assert empty.empty and list(empty.columns) == JOB_COLUMNS
            why = await call(lq.why, last_id)
            assert why["state"] == "ready" and why["ahead"] == 3
            assert "waiting behind 3" in why["reason"]
            assert (await call(lq.why, "no-such-job"))["state"] == "unknown"

            await call(lq.follow)
            assert lq.following and lq.stream_stats["snapshot"] >= 4  # enqueued, from the ring
            async with worker.serving():
                # By priority: fail_id fails (and backs off 60 s), then hold_id is held.
                await wait_events(owner, lambda ev: count(ev, "claimed", hold_id) == 1
                                  and count(ev, "retry_scheduled", fail_id) == 1)
                why = await call(lq.why, fail_id)
                assert why["state"] == "delayed" and why["attempts"] == 1
                assert "backing off after attempt 1 failed with" in why["reason"]
                assert "smtp down" in why["reason"]
                why = await call(lq.why, hold_id)
                assert why["state"] == "leased" and why["worker"].startswith("wk:")
                assert why["worker"] in why["reason"]
                assert "waiting behind 1 " in (await call(lq.why, last_id))["reason"]
                leases = await call(lq.leases)
                assert leases.job_id.tolist() == [hold_id] and leases.worker[0] == why["worker"]
                assert leases.attempt[0] == 1 and leases.deadline[0] == why["until"]
                counts = (await call(lq.stats))["counts"]
                assert counts == {"ready": 2, "delayed": 1, "leased": 1, "done": 0, "dead": 0,
                                  "cancelled": 0, "expired": 0, "waiting": 0}
                release.set()
                await wait_events(owner, lambda ev: count(ev, "acked") == 3)
                # The follower sees the same flow, live (bounded: the stream is asynchronous).
                expected = [(hold_id, "claimed"), (fail_id, "nacked"),
                            (fail_id, "retry_scheduled")] + [(j, "acked") for j in ids[1:]]
                await wait_until(lambda: all(stream_kinds(lq)[k] == 1 for k in expected),
                                 what="claimed/nacked/retry_scheduled/acked streamed")
            kinds = stream_kinds(lq)
            assert all(kinds[(j, "enqueued")] == 1 for j in ids)  # snapshot and live merged once
            assert max(kinds.values()) == 1  # no event twice
            st = lq.stream_stats
            assert st["received"] >= len(expected) and st["dropped"] == 0 and st["bad"] == 0
            stats = await call(lq.stats)
            assert stats["totals"]["acked"] == 3 and stats["totals"]["nacked"] == 1
            assert stats["counts"]["delayed"] == 1

            for op, args in (("pause", ()), ("resume", ()), ("resubmit", (fail_id,)),
                             ("purge_dead", ()), ("cancel", (fail_id,))):
                with pytest.raises(AdminDisabled, match="admin=True"):
                    await call(getattr(lq, op), *args)
            dead = await call(lq.dead_letters)
            assert dead.empty and list(dead.columns)[:5] == ["job_id", "data", "attempts",
                                                            "last_error", "history"]
            await call(lq.unfollow)
            assert not lq.following and lq.stream_stats["following"] is False
            snapshot = await call(lq.events)  # now from the owner's ring
            assert (snapshot.kind == "acked").sum() == 3
        finally:
            await call(lq.close)


async def test_admin_ops_when_the_queue_opted_in():
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q", admin=True, max_attempts=1)
    worker = Istos(zenoh=configs[2], prefix=prefix, node_id="wk")
    poison = {"on": True}
    done: dict[str, Any] = {}

    @worker.worker("q", concurrency=2, poll_interval_s=0.1)
    async def work(job: dict, ctx: JobContext) -> None:
        if job.get("poison") and poison["on"]:
            raise ValueError("poison pill")
        done[ctx.job_id] = job

    async with owner.serving(), worker.serving():
        lq = await call(attach, "q", configs[1], prefix=prefix)
        try:
            d1 = await owner.enqueue("q", {"poison": 1, "n": 1})
            d2 = await owner.enqueue("q", {"poison": 1, "n": 2})
            await wait_events(owner, lambda ev: count(ev, "dead_lettered") == 2)
            dead = await call(lq.dead_letters)
            assert sorted(dead.job_id) == sorted([d1, d2])
            row = dead.set_index("job_id").loc[d1]
            assert row.data == {"poison": 1, "n": 1} and row.attempts == 1
            assert "poison pill" in row.last_error and len(row.history) == 1
            why = await call(lq.why, d1)
            assert why["state"] == "dead" and why["dead_letter"]["data"] == {"poison": 1, "n": 1}
            assert "body" not in why["dead_letter"] and "poison pill" in why["reason"]

            # Paused: the worker keeps asking (nudge, then polls) and gets nothing.
            qowner, asked = owner.owners["q"], asyncio.Event()
            handed: list[int] = []
            claim = qowner.state.claim

            def counting_claim(workers: list[str], now: float, **kw: Any) -> list[Any]:
                got = claim(workers, now, **kw)
                handed.append(len(got))
                if len(handed) >= 3:
                    asked.set()
                return got

            await call(lq.pause)
            assert (await call(lq.stats))["paused"] is True
            qowner.state.claim = counting_claim  # instance attribute: the owner calls this
            j = await owner.enqueue("q", {"n": 3})
            await asyncio.wait_for(asked.wait(), 5.0)
            assert sum(handed) == 0 and j not in done
            assert (await call(lq.why, j))["reason"].endswith("(claiming is paused)")
            await call(lq.resume)
            await wait_events(owner, lambda ev: count(ev, "acked", j) == 1)
            assert done[j] == {"n": 3} and sum(handed) == 1

            poison["on"] = False
            new_id = await call(lq.resubmit, d1)
            assert new_id not in (d1, d2)
            with pytest.warns(DeprecationWarning, match="LiveQueue.aresubmit"):
                assert await lq.arequeue(d1) == new_id  # the old name: the same, idempotent
            await wait_events(owner, lambda ev: count(ev, "acked", new_id) == 1)
            assert done[new_id] == {"poison": 1, "n": 1}
            with pytest.raises(LookupError, match="no dead job"):
                await call(lq.resubmit, "no-such-job")

            late = await owner.enqueue("q", {"n": 4}, delay_s=60)
            assert await call(lq.cancel, late) == "cancelled"
            assert await call(lq.cancel, late) == "too_late"
            assert (await call(lq.why, late))["state"] == "cancelled"
            assert await call(lq.purge_dead, [d2]) == 1
            assert (await call(lq.dead_letters)).job_id.tolist() == [d1]
            assert await call(lq.purge_dead) == 1
            assert (await call(lq.dead_letters)).empty
            assert (await call(lq.stats))["counts"]["dead"] == 0
        finally:
            await call(lq.close)


# -- OS processes ---------------------------------------------------------------------------------
def spawn(script: str, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(PROCS / script), *args], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, **env})


async def read_line(proc: subprocess.Popen[str], timeout_s: float = 20.0) -> str:
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout_s)
    assert line, f"process exited: {proc.stderr.read() if proc.poll() is not None else ''}"
    return line.strip()


async def command(proc: subprocess.Popen[str], text: str) -> str:
    assert proc.stdin is not None
    proc.stdin.write(text + "\n")
    proc.stdin.flush()
    return await read_line(proc)


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


async def test_attach_to_owner_and_worker_os_processes_changes_nothing(tmp_path):
    configs, prefix, n = isolated_configs(3), unique_prefix(), 300
    out = tmp_path / "worked.jsonl"
    owner = spawn("live_node.py", json.dumps(configs[0]), prefix, "q")
    worker = spawn("zworker.py", json.dumps(configs[1]), prefix, "q", "record", str(out))
    try:
        assert await read_line(owner) == "READY" and await read_line(worker) == "READY"
        # The owner lives in another process: calling the sync API on this loop is fine.
        with attach("q", configs[2], prefix=prefix) as lq:
            assert lq.stats()["totals"]["enqueued"] == 0
            assert owner.stdin is not None
            owner.stdin.write(f"enqueue {n}\n")
            owner.stdin.flush()
            acked: list[int] = []
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while not acked or acked[-1] < n:
                assert loop.time() < deadline, f"acked only {acked[-1:]} of {n}"
                acked.append(lq.stats()["totals"]["acked"])
                if acked[-1] and not lq.following:
                    # Follow while jobs flow: the ring snapshot and the live stream overlap,
                    # and the window must still hold every event exactly once (checked below).
                    lq.follow(window=10 * n)
                await asyncio.sleep(0.005)  # a sampling interval, not a synchronisation
            assert acked == sorted(acked)  # totals only grow
            await wait_until(lambda: sum(k == "acked" for _, k in stream_kinds(lq)) == n,
                             timeout_s=10, what="every ack streamed")
            stats, events = lq.stats(), lq.events(limit=10 * n)
            attach_node, stream = lq.node_id, lq.stream_stats
        assert await read_line(owner) == f"ENQUEUED {n}"
        report = json.loads((await command(owner, "report")).removeprefix("REPORT "))
        assert await command(owner, "quit") == "BYE"
    finally:
        stop(owner)
        stop(worker)
    # The owner's own log: every job acked exactly once, claimed only by the worker process.
    assert len(report["job_ids"]) == n and sorted(report["acked"]) == sorted(report["job_ids"])
    assert set(report["acked"].values()) == {1}
    assert report["claimed_by"] and all(w.startswith("record-") for w in report["claimed_by"])
    assert stats["totals"]["enqueued"] == report["kinds"]["enqueued"] == n
    assert stats["totals"]["acked"] == report["kinds"]["acked"] == n
    # The stream carried the same flow, and attaching never claimed anything.
    kinds = Counter(events.kind)
    for kind in ("enqueued", "claimed", "acked"):
        assert kinds[kind] == report["kinds"][kind], kind
    assert max(Counter(zip(events.job_id, events.kind, events.attempt)).values()) == 1
    assert stream["dropped"] == 0 and stream["bad"] == 0
    claimed = events[events.kind == "claimed"]
    assert not any(attach_node in w for w in claimed.worker)
    assert Counter(events[events.kind == "acked"].job_id) == Counter(report["acked"])
    rows = [json.loads(line)["job"]["i"] for line in out.read_text().splitlines()]
    assert sorted(rows) == list(range(n))  # the worker ran each job exactly once


# -- the sync API inside a running loop, and failures ---------------------------------------------
class ThreadOwner:
    """An owner app serving on its own event loop in a thread (not the test's loop)."""

    def __init__(self, config: dict[str, Any], prefix: str, queue: str) -> None:
        self.app = Istos(zenoh=config, prefix=prefix, node_id="thread-owner")
        self.app.queue(queue)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)

    async def _main(self) -> None:
        self.loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with self.app.serving():
            self._ready.set()
            await self._stop.wait()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def __enter__(self) -> ThreadOwner:
        self._thread.start()
        assert self._ready.wait(10), "owner thread did not start serving"
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


async def test_sync_api_called_directly_inside_a_running_event_loop():
    configs, prefix = isolated_configs(2), unique_prefix()
    with ThreadOwner(configs[0], prefix, "q") as owner:
        for i in range(3):
            owner.run(owner.app.enqueue("q", {"i": i}))
        lq = attach("q", configs[1], prefix=prefix)  # blocking, on this running loop
        try:
            assert lq.stats()["counts"]["ready"] == 3
            assert sorted(d["i"] for d in lq.jobs().data) == [0, 1, 2]
            assert lq.follow() is lq
            jid = owner.run(owner.app.enqueue("q", {"i": 3}))
            await wait_until(lambda: stream_kinds(lq)[(jid, "enqueued")] == 1,
                             what="enqueue streamed")
            assert "ready=4" in repr(lq) and "following" in repr(lq)
            await asyncio.sleep(0)  # this loop was never taken over
        finally:
            lq.close()
            lq.close()  # idempotent
    assert "closed" in repr(lq)
    with pytest.raises(IstosError, match="closed"):
        lq.stats()


async def test_follow_merges_ring_snapshot_and_live_stream_once_each():
    configs, prefix = isolated_configs(2), unique_prefix()
    with ThreadOwner(configs[0], prefix, "q") as owner:
        qowner = owner.app.owners["q"]
        ring_op = qowner.handler("events")
        assert ring_op is not None

        async def ring_with_overlap(msg: dict[str, Any]) -> dict[str, Any]:
            # Emitted once the owner publishes and before it reads its ring for the snapshot:
            # this event reaches the follower twice, live and in the snapshot.
            await qowner.enqueue(codec.encode_body({"n": 1}), job_id="overlap")
            return await ring_op(msg)

        qowner.extend(Hooks(ops={"events": ring_with_overlap}))
        with attach("q", configs[1], prefix=prefix) as lq:
            lq.follow()
            await wait_until(lambda: lq.stream_stats["received"] == 1, what="live copy")
            kinds = stream_kinds(lq)
            assert kinds[("overlap", "enqueued")] == 1 and kinds[("", "owner_up")] == 1
            st = lq.stream_stats
            assert st["duplicates"] == 1 and st["held"] == st["snapshot"] == 2


async def test_replies_too_big_for_one_message_are_fetched_in_smaller_pieces():
    configs, prefix = isolated_configs(2), unique_prefix()
    with ThreadOwner(configs[0], prefix, "q") as owner:

        async def fill(n: int) -> list[str]:
            return [await owner.app.enqueue("q", {"i": i}) for i in range(n)]

        ids = owner.run(fill(8000))
        with attach("q", configs[1], prefix=prefix) as lq:
            assert lq.jobs(limit=2500, offset=10).job_id.tolist() == ids[10:2510]  # 3 pages
            # 8,001 events (~1.3 MB) exceed the message cap: the most recent ones that fit.
            ring = lq.events(limit=10_000)
            assert 1000 <= len(ring) < 8001 and ring.job_id.iloc[-1] == ids[-1]
            lq.follow()
            assert lq.stream_stats["snapshot"] == len(ring)


async def test_follow_is_renewed_so_the_stream_outlives_one_ttl(monkeypatch):
    # A 1.5 s ttl (renewed every 0.5 s): without renewals the owner would stop publishing.
    monkeypatch.setattr(sys.modules["istos_nb.live.attach"], "FOLLOW_TTL_S", 1.5)
    configs, prefix = isolated_configs(2), unique_prefix()
    with ThreadOwner(configs[0], prefix, "q") as owner, \
            attach("q", configs[1], prefix=prefix) as lq:
        lq.follow()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await wait_until(lambda: loop.time() - started > 2.0 and lq.stream_stats["renewals"] >= 3,
                         what="follow renewed past its first ttl")
        jid = owner.run(owner.app.enqueue("q", {"late": True}))
        await wait_until(lambda: stream_kinds(lq)[(jid, "enqueued")] == 1,
                         what="an event after the first ttl streamed")
        assert lq.stream_stats["renew_errors"] == 0


def test_no_owner_raises_owner_unavailable_and_leaves_nothing_running():
    (config,) = isolated_configs(1)
    before = {t for t in threading.enumerate() if t.name.startswith("istos-attach-")}
    with pytest.raises(OwnerUnavailable, match="no owner of queue 'nobody'"):
        attach("nobody", config, prefix=unique_prefix(), timeout_s=0.5)
    after = {t for t in threading.enumerate() if t.name.startswith("istos-attach-")}
    assert after == before


def test_import_istos_nb_is_lazy_and_attach_is_the_function():
    code = ("import sys, istos_nb\n"
            "assert 'istos_nb.attach' not in sys.modules and 'pandas' not in sys.modules\n"
            "from istos_nb.attach import LiveQueue\n"
            "import istos_nb\n"
            "assert callable(istos_nb.attach) and istos_nb.attach.__name__ == 'attach'\n"
            "assert istos_nb.LiveQueue is LiveQueue and 'attach' in dir(istos_nb)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
