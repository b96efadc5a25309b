"""Write, then apply: storage outages on a private redis-server that the test SIGKILLs and
restarts (append-only, fsync always), and the shutdown promise on a job's last attempt.

Nothing here touches the shared Redis on 6379.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgpack
import pytest
from helpers import count, wait_events
from services import free_port, redis_log_tail, start_throwaway_redis

from istos import Istos, JobContext, MemoryStorage, RedisStoragePlugin, StorageUnavailable
from istos.transport.local import LocalMesh


class PrivateRedis:
    """A redis-server on a free port whose data survives SIGKILL (appendfsync always)."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        self.dir = str(data_dir)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = start_throwaway_redis(self.port, self.dir)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.kill()
    # Shown with a failed test only (pytest's captured teardown output): one clean-clone run
    # beside a CPU hog saw the server refuse connections right after a restart it had passed.
    print(f"redis-server log (port {server.port}):\n{redis_log_tail(server.dir)}")


def storage(server: PrivateRedis) -> RedisStoragePlugin:
    return RedisStoragePlugin(server.url, key_prefix="t", connect_timeout_s=0.3, op_timeout_s=0.3)


@pytest.fixture
async def owner(redis_server: PrivateRedis) -> AsyncIterator[Istos]:
    app = Istos(storage=storage(redis_server), transport=LocalMesh().transport("owner"),
                shutdown_grace_s=0.0)
    app.queue("q", lease_s=0.5, max_attempts=1, sweep_interval_s=0.05, keep_results=True)
    async with app.serving():
        yield app


async def stored(server: PrivateRedis, job_id: str) -> dict:
    probe = storage(server)
    try:
        raw = await probe.get("jobs:q", job_id)
    finally:
        await probe.close()
    assert raw is not None
    return msgpack.unpackb(raw, raw=False)


async def claim(app: Istos, n: int = 1) -> list[dict]:
    reply = await app.client("q").call("claim", workers=[f"w#{i}" for i in range(n)],
                                       node="w")
    return list(reply["jobs"])


async def test_claims_during_an_outage_lease_nothing_and_burn_no_attempt(owner, redis_server):
    ids = [await owner.enqueue("q", {"i": i}) for i in range(4)]
    redis_server.kill()
    state = owner.owners["q"].state
    for _ in range(5):  # a worker polling through the outage, past several lease lengths
        with pytest.raises(StorageUnavailable):
            await claim(owner, 4)
        await asyncio.sleep(0.2)
    assert state.counts["ready"] == 4 and state.counts["leased"] == 0
    assert all(state.jobs[j].attempts == 0 and not state.jobs[j].history for j in ids)
    assert count(list(owner.events.recent()), "claimed") == 0  # nothing emitted either
    redis_server.start()
    jobs = await claim(owner, 4)
    assert sorted(j["job_id"] for j in jobs) == sorted(ids)
    assert {j["attempt"] for j in jobs} == {1}  # max_attempts=1: the first try is intact
    assert (await stored(redis_server, ids[0]))["state"] == "leased"


async def test_writes_queued_behind_a_failing_one_fail_with_it(owner, redis_server,
                                                               monkeypatch):
    """Group commit: a claim whose write waits behind a write that then times out (the store
    is frozen) fails too, and memory forgets both: they were applied on top of each other."""
    import signal

    ids = [await owner.enqueue("q", {"i": i}) for i in range(4)]
    state = owner.owners["q"].state
    # The second claim is sent once the first one's write has reached the store (an event,
    # not a sleep: on a loaded machine the first claim can take any time to get there).
    store, in_flight = owner.node.storage, asyncio.Event()
    apply = store.apply

    async def apply_and_tell(*args, **kwargs):
        in_flight.set()
        return await apply(*args, **kwargs)

    monkeypatch.setattr(store, "apply", apply_and_tell)
    assert redis_server.proc is not None
    redis_server.proc.send_signal(signal.SIGSTOP)
    try:
        first = asyncio.create_task(claim(owner, 2))
        await asyncio.wait_for(in_flight.wait(), 10)  # the first claim's write is in flight
        second = asyncio.create_task(claim(owner, 2))
        results = await asyncio.gather(first, second, return_exceptions=True)
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)
    assert all(isinstance(r, StorageUnavailable) for r in results), results
    assert state.counts["ready"] == 4 and state.counts["leased"] == 0
    assert all(state.jobs[j].attempts == 0 for j in ids)
    assert len(await claim(owner, 4)) == 4


async def test_failed_ack_leaves_memory_and_storage_agreeing(owner, redis_server):
    jid = await owner.enqueue("q", {"i": 0})
    (job,) = await claim(owner)
    redis_server.kill()
    with pytest.raises(StorageUnavailable):
        await owner.client("q").call("ack", job_id=jid, token=job["token"], result=None)
    rec = owner.owners["q"].state.jobs[jid]
    assert rec.state == "leased" and rec.lease_token == job["token"]
    redis_server.start()
    on_disk = await stored(redis_server, jid)
    assert on_disk["state"] == "leased" and on_disk["lease_token"] == job["token"]
    # The same ack, retried once the store is back, is accepted: both sides say done.
    reply = await owner.client("q").call("ack", job_id=jid, token=job["token"], result=None)
    assert reply["status"] == "ok"
    assert rec.state == "done" and (await stored(redis_server, jid))["state"] == "done"


async def test_lease_expiring_during_an_outage_is_not_counted(owner, redis_server):
    """Chosen rule: an expiry whose write fails is not applied (the job stays leased in memory,
    as in storage, and the sweeper retries); once it is applied, a lease claimed before the
    owner's last failed write goes back to ready without counting its attempt."""
    jid = await owner.enqueue("q", {"i": 0})
    (job,) = await claim(owner)
    redis_server.kill()
    with pytest.raises(StorageUnavailable):  # the worker's ack cannot get through
        await owner.client("q").call("ack", job_id=jid, token=job["token"], result=None)
    queue = owner.owners["q"]
    rec, acked_failed_at = queue.state.jobs[jid], queue.failed_at
    assert acked_failed_at is not None
    # Wait (bounded) for the sweeper's expiry write to fail too: the next failed write after
    # the ack's can only be that one, once the lease has run out (nothing else writes).
    deadline = asyncio.get_running_loop().time() + 15.0
    while queue.failed_at == acked_failed_at:
        assert asyncio.get_running_loop().time() < deadline, "the sweeper never tried"
        await asyncio.sleep(0.02)
    assert rec.state == "leased" and rec.attempts == 1  # not applied: its write failed
    redis_server.start()
    events = await wait_events(owner, lambda ev: count(ev, "lease_expired", jid) >= 1,
                               timeout_s=20.0)  # the store's restart, on a loaded machine
    assert count(events, "dead_lettered", jid) == 0  # max_attempts=1, yet not dead
    assert rec.state == "ready" and rec.attempts == 0
    assert rec.history[-1].error is not None and "storage outage" in rec.history[-1].error
    on_disk = await stored(redis_server, jid)
    assert (on_disk["state"], on_disk["attempts"]) == ("ready", 0)
    (again,) = await claim(owner)
    assert again["attempt"] == 1 and again["token"] != job["token"]
    # The old delivery's token no longer settles anything once the job was leased again.
    reply = await owner.client("q").call("ack", job_id=jid, token=job["token"], result=None)
    assert reply["status"] == "stale"


async def test_enqueue_during_an_outage_is_refused_then_accepted(owner, redis_server):
    redis_server.kill()
    with pytest.raises(StorageUnavailable):
        await owner.enqueue("q", {"i": 1}, job_id="late")
    assert "late" not in owner.owners["q"].state.jobs
    redis_server.start()
    assert await owner.enqueue("q", {"i": 1}, job_id="late") == "late"


async def test_jobs_flowing_through_store_sigkills_all_complete(redis_server):
    """Jobs flow through a worker while the store is SIGKILLed and restarted twice; then
    storage ends empty (every ack written), nothing is lost or dead-lettered."""
    mesh, done = LocalMesh(), []
    owner = Istos(storage=storage(redis_server), transport=mesh.transport("owner"))
    owner.queue("q", lease_s=0.6, max_attempts=2, sweep_interval_s=0.05, retry_backoff_s=0.01)
    worker = Istos(transport=mesh.transport("worker"), shutdown_grace_s=1.0)

    @worker.worker("q", concurrency=4, poll_interval_s=0.05)
    async def work(job: dict) -> None:
        await asyncio.sleep(0.01)
        done.append(job["i"])

    async with owner.serving(), worker.serving():
        accepted = 0
        for _outage in range(2):
            for i in range(accepted, accepted + 40):
                await owner.enqueue("q", {"i": i}, job_id=f"j{i}")
            accepted += 40
            await asyncio.sleep(0.05)
            redis_server.kill()
            await asyncio.sleep(1.0)  # longer than a lease
            redis_server.start()
        await wait_events(owner, lambda ev: set(done) >= set(range(accepted)), timeout_s=20)
        await wait_events(owner, lambda ev: owner.owners["q"].state.counts["leased"] == 0
                          and not owner.owners["q"].state.jobs, timeout_s=20)
        assert owner.owners["q"].state.counts["dead"] == 0
    probe = storage(redis_server)
    assert await probe.scan("jobs:q") == []  # every ack reached storage too
    await probe.close()


# -- shutdown keeps its word ------------------------------------------------------------------


@pytest.mark.parametrize("durable", [False, True])
async def test_shutdown_hands_back_a_job_on_its_last_attempt(durable):
    mesh = LocalMesh()
    owner = Istos(storage=MemoryStorage(durable=durable), transport=mesh.transport("owner"))
    owner.queue("q", lease_s=30, max_attempts=1)
    first = Istos(transport=mesh.transport("w1"), shutdown_grace_s=0.05)
    started, attempts = asyncio.Event(), []

    @first.worker("q", concurrency=2, prefetch=0)
    async def slow(job: dict, ctx: JobContext) -> None:
        attempts.append(ctx.attempt)
        started.set()
        await asyncio.Event().wait()  # longer than any grace period

    second = Istos(transport=mesh.transport("w2"))
    ran: list[tuple[int, int]] = []

    @second.worker("q")
    async def fast(job: dict, ctx: JobContext) -> None:
        ran.append((job["i"], ctx.attempt))

    async with owner.serving():
        jid = await owner.enqueue("q", {"i": 7})
        async with first.serving():
            await asyncio.wait_for(started.wait(), 5)
        rec = owner.owners["q"].state.jobs[jid]
        # Back at once (not after the 30 s lease), and the cancelled try is not counted.
        assert rec.state == "ready" and rec.attempts == 0
        assert rec.history[-1].outcome == "released"
        async with second.serving():
            await wait_events(owner, lambda ev: count(ev, "acked", jid) == 1)
    assert attempts == [1] and ran == [(7, 1)]
    assert count(list(owner.events.recent()), "dead_lettered") == 0
