"""Parked claims over real Zenoh: an idle worker's claim waits at the owner for a job.

Workers here poll every 60 s, so a job picked up within the tests' bounded waits was handed
over by the parked claim (or, where a test says so, the nudge), never by the poll.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from helpers import count, wait_events
from zenoh_util import isolated_configs, query_when_served, unique_prefix, wait_until

from istos import Istos, JobContext, MemoryStorage, codec, protocol
from istos.core.records import LEASED, READY
from istos.owner.extension import Hooks
from istos.owner.extensions.parking import ParkedClaims
from istos.transport.zenoh import ZenohTransport

POLL = 60.0  # longer than every bounded wait below: the poll never explains a pickup
PROCS = Path(__file__).parent / "procs"


def parking_of(app: Istos, queue: str = "q") -> ParkedClaims:
    owner = app.owners[queue]
    return next(e for e in owner.extensions if isinstance(e, ParkedClaims))


def worker_app(config: dict[str, Any], prefix: str, name: str, seen: list[Any],
               started: asyncio.Event | None = None, *, park: bool = True,
               concurrency: int = 1) -> Istos:
    app = Istos(zenoh=config, prefix=prefix, node_id=name, request_timeout_s=10.0)

    @app.worker("q", concurrency=concurrency, poll_interval_s=POLL, park=park)
    async def handle(job: Any, ctx: JobContext) -> None:
        seen.append((job, ctx.worker, ctx.attempt))
        if started is not None:
            started.set()

    return app


async def test_parked_claim_is_answered_on_enqueue_without_a_nudge():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    seen: list[Any] = []
    started = asyncio.Event()
    worker = worker_app(configs[1], prefix, "w1", seen, started)
    async with owner.serving(), worker.serving():
        parking = parking_of(owner)
        await wait_until(lambda: parking.parked, 15, "the idle worker's claim parked")
        nudges: list[bytes] = []
        sub = await owner.node.transport.declare_subscriber(  # type: ignore[union-attr]
            owner.node.key("q", "nudge"), lambda key, payload: nudges.append(payload))
        try:
            await owner.enqueue("q", {"n": 1})
            await asyncio.wait_for(started.wait(), 15)
        finally:
            sub.close()
        assert parking.stats["answered_by_job"] == 1
        assert nudges == []  # the parked claim was the wake-up: no nudge message went out
        assert seen[0][0] == {"n": 1} and seen[0][2] == 1


async def test_without_parking_the_nudge_still_wakes_the_worker():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    seen: list[Any] = []
    started = asyncio.Event()
    worker = worker_app(configs[1], prefix, "w1", seen, started, park=False)
    async with owner.serving(), worker.serving():
        await wait_until(lambda: len(owner.owners["q"].hungry) == 1, 15, "worker idle")
        await owner.enqueue("q", {"n": 1})
        await asyncio.wait_for(started.wait(), 15)
        assert parking_of(owner).stats["parked"] == 0


async def raw_claim(transport: ZenohTransport, prefix: str, slots: list[str],
                    park_s: float, timeout_s: float = 30.0, *, node: str = "raw",
                    park_key: str | None = "k0") -> dict[str, Any]:
    msg: dict[str, Any] = {"v": protocol.VERSION, "op": "claim", "workers": slots,
                           "node": node, "park_s": park_s}
    if park_key is not None:
        msg["park_key"] = park_key
    return await raw_op(transport, prefix, "work", msg, timeout_s)


async def raw_op(transport: ZenohTransport, prefix: str, role: str, msg: dict[str, Any],
                 timeout_s: float = 10.0) -> dict[str, Any]:
    raw = await query_when_served(transport, f"{prefix}/q/q/rpc/{role}",
                                  codec.encode_message({"v": protocol.VERSION, **msg}),
                                  timeout_s=timeout_s)
    return codec.decode_message(raw)


async def test_a_parked_claim_is_proven_by_its_key_not_by_the_ids_the_workers_op_shows():
    """A second client that read ``workers`` knows the parked worker's node and slot ids, not
    its key: its unparks end nothing, its claims on that slot do not displace the parked claim,
    and the job enqueued next goes to the parked worker."""
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    seen: list[Any] = []
    started = asyncio.Event()
    worker = worker_app(configs[1], prefix, "w1", seen, started)
    mallory = ZenohTransport(configs[2], node_id="mallory")
    async with owner.serving(), worker.serving():
        await mallory.start()
        try:
            parking = parking_of(owner)
            await wait_until(lambda: parking.parked, 15, "the worker's claim parked")
            rows = (await raw_op(mallory, prefix, "read", {"op": "workers"}))["workers"]
            (row,) = rows
            node, slot = row["node"], row["worker"] + "#0"
            assert node == "w1" and slot in parking.parked
            for key in (None, "k0", "0" * 32, slot.replace("#", "."), node):
                fields = {} if key is None else {"park_key": key}
                reply = await raw_op(mallory, prefix, "work", {
                    "op": "unpark", "workers": [slot], "node": node, **fields})
                assert reply["ok"] and reply["unparked"] == 0, reply
                claim = await raw_claim(mallory, prefix, [slot], park_s=30, node=node,
                                        park_key=key, timeout_s=10)
                assert claim["ok"] and claim["jobs"] == [] and "parked" not in claim, claim
            assert slot in parking.parked and parking.stats["dropped"] == 0
            await owner.enqueue("q", {"n": 1})
            await asyncio.wait_for(started.wait(), 15)
        finally:
            await mallory.close()
        assert parking.stats["answered_by_job"] == 1 and seen[0][0] == {"n": 1}


async def test_parked_claim_expires_at_its_bound_with_no_job():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    client = ZenohTransport(configs[1], node_id="raw")
    async with owner.serving():
        await client.start()
        try:
            t0 = time.monotonic()
            reply = await raw_claim(client, prefix, ["raw:s#0"], park_s=0.4)
            elapsed = time.monotonic() - t0
        finally:
            await client.close()
        assert reply["ok"] and reply["jobs"] == [] and reply["parked"] is True
        assert elapsed >= 0.35  # held at the owner until its bound (timers never fire early)
        parking = parking_of(owner)
        assert parking.stats["expired"] == 1 and not parking.parked


async def test_a_claim_without_a_park_key_is_answered_at_once():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    client = ZenohTransport(configs[1], node_id="raw")
    async with owner.serving():
        await client.start()
        try:
            reply = await raw_claim(client, prefix, ["raw:s#0"], park_s=30, park_key=None)
        finally:
            await client.close()
        assert reply["ok"] and reply["jobs"] == [] and "parked" not in reply
        assert parking_of(owner).stats["parked"] == 0


async def test_a_park_longer_than_the_cap_is_refused_by_the_schema():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    client = ZenohTransport(configs[1], node_id="raw")
    async with owner.serving():
        await client.start()
        try:
            reply = await raw_claim(client, prefix, ["raw:s#0"],
                                    park_s=protocol.MAX_PARK_S + 1)
        finally:
            await client.close()
    assert reply["ok"] is False and reply["error"] == "ProtocolError"
    assert "park_s" in reply["message"]


async def test_a_newer_claim_from_the_same_slots_supersedes_the_parked_one():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    client = ZenohTransport(configs[1], node_id="raw")
    async with owner.serving():
        await client.start()
        try:
            parking = parking_of(owner)
            first = asyncio.create_task(raw_claim(client, prefix, ["raw:s#0"], park_s=30))
            await wait_until(lambda: parking.parked, 15, "first claim parked")
            second = asyncio.create_task(raw_claim(client, prefix, ["raw:s#0"], park_s=30))
            old = await asyncio.wait_for(first, 15)  # answered at once, empty
            assert old["jobs"] == [] and old["parked"] is True
            await wait_until(lambda: parking.parked, 15, "second claim parked")
            await owner.enqueue("q", "job")
            new = await asyncio.wait_for(second, 15)
        finally:
            await client.close()
        assert [j["body"] for j in new["jobs"]] == [codec.encode_body("job", queue="q")]
        assert owner.owners["q"].state.counts[LEASED] == 1  # one lease, to the newer claim


async def test_worker_stop_drops_its_parked_claim_and_leases_nothing():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    seen: list[Any] = []
    worker = worker_app(configs[1], prefix, "w1", seen)
    async with owner.serving():
        parking = parking_of(owner)
        await worker.start()
        try:
            await wait_until(lambda: parking.parked, 15, "the idle worker's claim parked")
        finally:
            # Well before its 60 s bound: the worker ends its parked claim with unpark.
            await asyncio.wait_for(worker.stop(), 20)
        assert not parking.parked and parking.stats["dropped"] >= 1
        await owner.enqueue("q", "after")
        state = owner.owners["q"].state
        assert state.counts[READY] == 1 and state.counts[LEASED] == 0
    assert seen == []


async def test_owner_stop_ends_parked_claims_and_the_worker_finds_the_next_owner():
    configs, prefix = isolated_configs(3), unique_prefix()
    first = Istos(zenoh=configs[0], prefix=prefix, node_id="owner-a")
    first.queue("q")
    seen: list[Any] = []
    started = asyncio.Event()
    worker = worker_app(configs[2], prefix, "w1", seen, started)
    await first.start()
    try:
        async with worker.serving():
            parking = parking_of(first)
            await wait_until(lambda: parking.parked, 15, "claim parked at the first owner")
            await asyncio.wait_for(first.stop(), 20)
            assert not parking.parked and parking.stats["dropped"] == 1
            second = Istos(zenoh=configs[1], prefix=prefix, node_id="owner-b")
            second.queue("q")
            async with second.serving():
                await wait_until(lambda: parking_of(second).parked, 15,
                                 "claim parked at the second owner")
                await second.enqueue("q", "next")
                await asyncio.wait_for(started.wait(), 15)
                assert parking_of(second).stats["answered_by_job"] == 1
                await worker.stop()  # while its owner is there to take the last ack
    finally:
        await first.stop()
    assert [s[0] for s in seen] == ["next"]


async def test_parked_claims_never_lease_one_job_twice():
    configs, prefix = isolated_configs(4), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    seen: list[Any] = []
    workers = [worker_app(configs[i], prefix, f"w{i}", seen, concurrency=2)
               for i in (1, 2, 3)]
    async with owner.serving(), workers[0].serving(), workers[1].serving(), \
            workers[2].serving():
        parking = parking_of(owner)
        await wait_until(lambda: len(parking.parked) == 3, 20, "three claims parked")
        for burst in range(10):  # bursts of concurrent enqueues and single ones between
            await asyncio.gather(*(owner.enqueue("q", burst * 100 + i) for i in range(9)))
            await owner.enqueue("q", burst * 100 + 99)
        await wait_until(lambda: len(seen) >= 100, 60, "every job handled")
        await wait_until(lambda: owner.owners["q"].state.counts[LEASED] == 0, 30, "all acked")
        assert parking.stats["answered_by_job"] >= 1
    bodies = sorted(s[0] for s in seen)
    assert bodies == sorted(b * 100 + i for b in range(10) for i in [*range(9), 99])
    assert all(s[2] == 1 for s in seen)  # each job ran once, on its first attempt
    assert {s[1].split(":")[0] for s in seen} <= {"w1", "w2", "w3"}


async def test_a_parking_workers_acks_ride_on_its_next_parked_claim():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    seen: list[Any] = []
    worker = worker_app(configs[1], prefix, "w1", seen, concurrency=2)
    async with owner.serving(), worker.serving():
        qowner = owner.owners["q"]
        settle = qowner.handler("settle")
        assert settle is not None
        settles: list[dict[str, Any]] = []

        async def counted(msg: dict[str, Any]) -> dict[str, Any]:
            settles.append(msg)
            return await settle(msg)

        qowner.extend(Hooks(ops={"settle": counted}))
        parking = parking_of(owner)
        for i in range(5):  # one job at a time, to an idle worker each time
            await wait_until(lambda: parking.parked, 15, "the idle worker's claim parked")
            await owner.enqueue("q", i)
            await wait_events(owner, lambda ev, n=i + 1: count(ev, "acked") == n, timeout_s=15)
        assert settles == []  # every ack travelled on the worker's next (parked) claim
        assert parking.stats["answered_by_job"] == 5


async def test_a_durable_queue_answers_a_parking_claim_at_once():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(storage=MemoryStorage(durable=True), zenoh=configs[0], prefix=prefix)
    owner.queue("q")
    client = ZenohTransport(configs[1], node_id="raw")
    async with owner.serving():
        await client.start()
        try:
            reply = await raw_claim(client, prefix, ["raw:s#0"], park_s=30, timeout_s=10)
        finally:
            await client.close()
        assert reply["ok"] and reply["jobs"] == [] and "parked" not in reply
        assert parking_of(owner).stats["parked"] == 0


async def test_a_worker_killed_while_parked_gets_no_job_and_burns_no_attempt(tmp_path):
    """Real processes: a worker process parks its claim, is SIGKILLed; once the owner has seen
    its token go (its parked claim ends), a job enqueued is not leased to the dead claim: a
    worker started afterwards runs it on attempt 1, long before the 30 s lease could expire."""
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q", lease_s=30.0)
    out = tmp_path / "dead.jsonl"
    proc = subprocess.Popen(
        [sys.executable, str(PROCS / "zworker.py"), json.dumps(configs[1]), prefix, "q",
         "record", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "ISTOS_POLL_S": str(POLL), "ISTOS_CONCURRENCY": "1"})
    seen: list[Any] = []
    started = asyncio.Event()
    try:
        async with owner.serving():
            parking = parking_of(owner)
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
            assert line.strip() == "READY", proc.stderr.read() if proc.poll() else line
            dead = f"record-{proc.pid}"
            await wait_until(lambda: any(e.node == dead for e in parking.parked.values()), 15,
                             "the worker process's claim parked")
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            killed = time.monotonic()
            await wait_until(lambda: not parking.parked, 15, "the dead claim ended")
            print(f"\nparked claim of the killed worker ended "
                  f"{(time.monotonic() - killed) * 1000:.1f} ms after the kill")
            assert parking.stats["worker_gone"] == 1 and dead in parking.gone
            jid = await owner.enqueue("q", {"after": "kill"})
            state = owner.owners["q"].state
            assert state.jobs[jid].state == READY and state.counts[LEASED] == 0
            rescuer = worker_app(configs[2], prefix, "rescuer", seen, started)
            async with rescuer.serving():
                await asyncio.wait_for(started.wait(), 15)
                await wait_events(owner, lambda ev: count(ev, "acked", jid) == 1, 15)
            claims = [e for e in owner.events.recent() if e.job_id == jid and e.kind == "claimed"]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    assert seen == [({"after": "kill"}, "rescuer:handle#0", 1)]
    assert [(e.attempt, e.worker) for e in claims] == [(1, "rescuer:handle#0")]
    assert not out.exists()  # the dead worker never ran anything


def test_simulated_crash_while_parked_leases_nothing_to_the_dead_node():
    """The simulator's crash drops the node's session and its worker token as a kill does: the
    owner ends the parked claim, and the job enqueued next waits for a live worker."""
    from istos_nb.sim import Simulation

    sim = Simulation(seed=1)
    sim.node("owner").queue("q", lease_s=30.0)
    for name in ("parked", "late"):
        sim.node(name).worker("q", poll_interval_s=POLL)(sim.handler(service_s=0.1))
    sim.crash("late", at=0.0, restart_after=8.0)  # up again at t = 8
    sim.crash("parked", at=5.0)  # dies holding its parked claim, never comes back
    sim.enqueue_jobs("owner", "q", 1, start=6.0)
    result = sim.run(until=20.0, progress=None)
    claims = result.events[result.events["kind"] == "claimed"]
    assert [(r.attempt, r.worker.split(":")[0]) for r in claims.itertuples()] == [(1, "late")]
    assert claims["t"].iloc[0] < 9.0  # at the restart, not a 30 s lease later
    assert result.check()["ok"].all()


async def test_a_worker_whose_claims_brought_jobs_parks_once_idle():
    """A worker that started on a backlog (every claim brought jobs, none parked) parks its
    claim as soon as it holds no job, so the next job is handed over by that claim, not by a
    nudge and a claim of its own."""
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    seen: list[Any] = []
    worker = worker_app(configs[1], prefix, "w1", seen, concurrency=4)
    async with owner.serving():
        await owner.enqueue_many("q", list(range(50)))
        async with worker.serving():
            await wait_events(owner, lambda ev: count(ev, "acked") == 50, timeout_s=30)
            parking = parking_of(owner)
            await wait_until(lambda: parking.parked, 15, "the idle worker's claim parked")
            nudges: list[bytes] = []
            sub = await owner.node.transport.declare_subscriber(  # type: ignore[union-attr]
                owner.node.key("q", "nudge"), lambda key, payload: nudges.append(payload))
            try:
                for i in range(3):
                    await wait_until(lambda: parking.parked, 15, "parked again")
                    await owner.enqueue("q", 100 + i)
                    await wait_events(owner, lambda ev, n=51 + i: count(ev, "acked") == n,
                                      timeout_s=15)
            finally:
                sub.close()
            assert parking.stats["answered_by_job"] == 3
            assert nudges == []


async def test_a_worker_of_a_durable_queue_waits_for_nudges_after_its_backlog():
    """The owner declines to park (durable storage): the idle worker asks once, then the
    nudges wake it as before."""
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(storage=MemoryStorage(durable=True), zenoh=configs[0], prefix=prefix)
    owner.queue("q")
    seen: list[Any] = []
    worker = worker_app(configs[1], prefix, "w1", seen, concurrency=2)
    async with owner.serving():
        await owner.enqueue_many("q", list(range(20)))
        async with worker.serving():
            await wait_events(owner, lambda ev: count(ev, "acked") == 20, timeout_s=30)
            await owner.enqueue("q", 99)
            await wait_events(owner, lambda ev: count(ev, "acked") == 21, timeout_s=15)
            runner = worker.runners[0]
            assert runner.parking.declined and parking_of(owner).stats["parked"] == 0
