"""Real processes that see the guarantees themselves, not only the final tally (issue 24):
a write refused by the fence stops the owner at once; a late ack (after the lease expired,
before anyone claimed the job again) is honoured, so the job is not run twice."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from test_chaos import mesh_configs
from test_chaos_ledger import ledger_lines, node, produce_range, redis_store

from istos import Istos

__all__ = ["redis_store"]  # the fixture, imported for pytest
pytestmark = pytest.mark.slow
INTRUDER_S = 3.0  # the intruder's lease: the replica may lead again only after it


async def next_line(proc, words: tuple[str, ...], timeout_s: float) -> str:
    """The next stdout line of ``proc`` that starts with one of ``words``."""
    assert proc.proc is not None and proc.proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no line starting with {words} within {timeout_s} s: "
                                 f"{proc.lines}")
        line = await asyncio.wait_for(asyncio.to_thread(proc.proc.stdout.readline), remaining)
        if not line:
            raise AssertionError(f"exited: {proc.lines}")
        proc.lines.append(line.strip())
        if line.startswith(words):
            return line.strip()


async def test_a_write_refused_by_the_fence_stops_the_owner_at_once(redis_store, monkeypatch):
    """The only replica leads and takes enqueues; another epoch begins in the store behind its
    back (an intruder with no liveliness token, so nothing on the mesh wakes the replica). Its
    next write is refused by the fence, and from that moment it answers nothing, reads
    included, without waiting for its next renewal to fail."""
    configs, prefix = mesh_configs(2), f"fen-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("ISTOS_TEST_REPORT_FENCE", "1")
    replica = node("replica", configs[0], prefix, redis_store)
    producer = Istos(zenoh=configs[1], prefix=prefix, node_id="producer", request_timeout_s=1.0)
    answers: list[tuple[float, float, bool]] = []  # (sent, answered or failed, ok)
    stop = asyncio.Event()

    async def probe() -> None:
        async def one(sent: float) -> None:
            try:
                await producer.client("q").call("stats", timeout_s=1.0)
                answers.append((sent, time.time(), True))
            except Exception:
                answers.append((sent, time.time(), False))
        tasks = []
        while not stop.is_set():
            tasks.append(asyncio.create_task(one(time.time())))
            await asyncio.sleep(0.02)  # the probe's cadence, not a synchronisation
        await asyncio.gather(*tasks)

    store = redis_store.client()
    await store.open()
    refused_at = None
    try:
        replica.start()
        await replica.expect("LEADING", 30)
        async with producer.serving():
            feeding = asyncio.create_task(produce_range(producer, 0, 100_000))
            probing = asyncio.create_task(probe())
            for _ in range(5):  # a renewal may notice first (rarely): then try again
                await asyncio.sleep(0.5)
                lease = await store.read_leader("ha:q")
                assert lease is not None
                stolen_at = time.time()
                assert await store.acquire_leader("ha:q", "intruder", now=stolen_at,
                                                  ttl_s=INTRUDER_S, steal_from=lease.holder)
                seen = await next_line(replica, ("FENCED", "STANDBY"), 10)
                if seen.startswith("FENCED") and float(seen.split()[1]) < stolen_at:
                    # A refusal from before the steal (seen once in a loaded clean-clone run:
                    # the probes then all came after it): not this test's; shown, and tried
                    # again once the replica leads again.
                    print(f"a write refused by the fence before the steal: {seen}")
                elif seen.startswith("FENCED"):
                    refused_at = float(seen.split()[1])
                    break
                await next_line(replica, ("LEADING",), 20)  # back once the intruder's expired
            await asyncio.sleep(INTRUDER_S)  # probes after the refusal
            stop.set()
            await probing
            feeding.cancel()
            await asyncio.gather(feeding, return_exceptions=True)
    finally:
        replica.kill()
        await store.close()
    assert refused_at is not None, "no write was refused by the fence in 5 tries"
    before = [ok for t, _, ok in answers if t < refused_at - 0.3]
    # Until the intruder's lease runs out, the replica cannot lead again (after that it may,
    # with a fresh owner that reloaded the queue: answers then are right).
    late = sorted(t - refused_at for t, done, ok in answers
                  if ok and t > refused_at and done < stolen_at + INTRUDER_S)
    assert before and all(before[-5:])  # it answered while it led
    assert not late, f"a fenced owner answered {len(late)} request(s), the first sent " \
                     f"{late[0]:.3f} s after the refusal"


async def test_a_late_ack_before_the_next_claim_is_honoured(tmp_path, monkeypatch):
    """A worker process runs a job for 1.5 s against a 1 s lease (no heartbeat): the lease
    expires and the job is ready again, but nobody claims it before the ack arrives. The owner
    honours that ack: the job ran once, was claimed once, and is done."""
    configs, prefix = mesh_configs(2), f"late-{uuid.uuid4().hex[:8]}"
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q", lease_s=1.0, sweep_interval_s=0.05, max_attempts=3)
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("ISTOS_JOB_S", "1.5")
    monkeypatch.setenv("ISTOS_CONCURRENCY", "1")  # no free slot of its own to claim it again
    worker = node("worker", configs[1], prefix, _NoStore(), ledger)
    kinds: list[str] = []
    acked = asyncio.Event()

    def seen(event) -> None:
        kinds.append(event.kind)
        if event.kind == "acked":
            acked.set()

    owner.events.subscribe(seen)
    try:
        async with owner.serving():
            worker.start()
            await worker.ready()
            await owner.enqueue("q", {"i": 0}, job_id="job-0")
            await asyncio.wait_for(acked.wait(), 30)
            await asyncio.sleep(1.0)  # long enough for a wrong second delivery to show
            rec = owner.owners["q"].state.jobs.get("job-0")
    finally:
        worker.kill()
    assert kinds.count("lease_expired") == 1  # it really was late
    assert kinds.count("claimed") == 1 and kinds.count("acked") == 1
    assert rec is None  # done, nothing kept (no results)
    assert ledger_lines([Path(ledger)]) == [0]  # it ran exactly once


class _NoStore:
    """A worker process needs no storage (ledger_node ignores the URL for workers)."""

    url = "redis://unused"
    ns = "unused"
