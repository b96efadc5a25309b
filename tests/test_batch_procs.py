"""Batches across real OS processes: three owner processes (``procs/batch_node.py``) on a
private loopback Zenoh mesh, durable storage on a private redis-server (append-only, fsync
always). P1 serves queue ``qa`` and leads the batches' home ``cb`` (an HA queue), P2 serves
``qb`` and stands by for ``cb``, P3 serves ``qc``. Mid-batch, P3 is SIGKILLed and restarted,
then P1 is SIGKILLed (P2 takes ``cb`` over: an HA failover) and restarted. The members'
handlers and the callbacks' handler write to a Redis list, an independent ledger in one
global order: every callback fired exactly once, after every member it waited for.

Also: 10,000 members in one batch (in-process, one node)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from services import free_port, start_throwaway_redis
from test_chaos import Proc, mesh_configs

from istos import Istos, JobContext
from istos.errors import IstosError
from istos.transport.local import LocalMesh

NODE = str(Path(__file__).parent / "procs" / "batch_node.py")
PER_PHASE = 12  # members per queue in each of the three phases


@dataclass
class Rig:
    """A private append-only redis-server (its process: the test stops it) with the names
    one run uses in it and on the mesh: the storage URL, the key namespace, the Zenoh prefix
    and the ledger's list."""

    store: subprocess.Popen[bytes]
    url: str
    ns: str
    prefix: str

    @property
    def ledger_key(self) -> str:
        return f"{self.ns}:ledger"


def private_rig(tmp_path: Path, tag: str) -> Rig:
    """A :class:`Rig` on a free port, its data under ``tmp_path``, its names ``tag``-ged."""
    port = free_port()
    return Rig(start_throwaway_redis(port, str(tmp_path)), f"redis://127.0.0.1:{port}/0",
               f"{tag}-{uuid.uuid4().hex[:8]}", f"{tag}{uuid.uuid4().hex[:8]}")


def owner(config: dict[str, Any], prefix: str, url: str, ns: str, ledger_key: str,
          queues: list[str]) -> Proc:
    """An owner process of ``queues`` (``procs/batch_node.py``; not started yet)."""
    proc = Proc("owner", config, prefix, url, ns, node=NODE)
    proc.args = [proc.args[0], NODE, json.dumps(config), prefix, url, ns, ledger_key, *queues]
    return proc


async def retry(what: str, step: Callable[[], Awaitable[Any]], timeout_s: float = 60.0) -> Any:
    """``await step()`` until it succeeds (an owner may be down or failing over)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await step()
        except IstosError as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: still failing after {timeout_s} s: {exc}") from exc
            await asyncio.sleep(0.1)  # an owner restarting: nothing to wait on but time


async def until(pred: Callable[[], Awaitable[bool]], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not await pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)  # polling the ledger in another process's Redis


@pytest.mark.slow
async def test_batches_across_three_owner_processes_with_a_sigkill_and_an_ha_failover(
        tmp_path: Path) -> None:
    rig = private_rig(tmp_path, "bp")
    store, url, ns, prefix, ledger_key = rig.store, rig.url, rig.ns, rig.prefix, rig.ledger_key
    configs = mesh_configs(4)
    procs = [owner(configs[i], prefix, url, ns, ledger_key, queues)
             for i, queues in enumerate((["qa", "cb"], ["qb", "cb"], ["qc"]))]
    ledger = Redis.from_url(url)
    app = Istos(zenoh=configs[3], prefix=prefix, node_id="producer", request_timeout_s=2.0)

    @app.worker("cb", poll_interval_s=0.1)
    async def callback(body: dict[str, Any], ctx: JobContext) -> None:
        await ledger.rpush(ledger_key, json.dumps({"job": ctx.job_id, "attempt": ctx.attempt,
                                                   "body": body}))

    async def entries() -> list[dict[str, Any]]:
        return [json.loads(x) for x in await ledger.lrange(ledger_key, 0, -1)]

    try:
        procs[0].start()
        await procs[0].expect("LEADING", 30)  # P1 leads cb
        for proc in procs[1:]:
            proc.start()
            await proc.ready()
        await procs[1].expect("STANDBY", 10)
        async with app.serving():
            ok = await retry("open", lambda: app.batch(
                on_success=("cb", "ok"), on_complete=("cb", "all"), on_death=("cb", "dead"),
                description="all succeed"))
            dies = await retry("open", lambda: app.batch(
                on_success=("cb", "ok"), on_complete=("cb", "all"), on_death=("cb", "dead"),
                description="two die"))
            members: dict[str, list[str]] = {ok.id: [], dies.id: []}

            async def phase(n: int) -> None:
                for i in range(PER_PHASE):
                    for q in ("qa", "qb", "qc"):
                        for batch in (ok, dies):
                            jid = f"{batch.id[3:11]}-{q}-{n}-{i}"
                            die = batch is dies and n == 1 and i == 0 and q != "qc"
                            await retry("add", lambda b=batch, q=q, j=jid, d=die: b.add(
                                q, {"die": d}, job_id=j))
                            members[batch.id].append(jid)

            async def ran(n: int) -> bool:
                return len({e["job"] for e in await entries()}) >= n

            await phase(0)
            await until(lambda: ran(PER_PHASE), 30, "members running")
            procs[2].kill()  # P3 (qc) SIGKILLed mid-batch ...
            adding = asyncio.create_task(phase(1))  # ... while members are being added
            await until(lambda: ran(2 * PER_PHASE), 30, "more members running")
            procs[2].start()  # ... and restarted on the same storage
            await procs[2].ready()
            await adding
            procs[0].kill()  # P1 (leads cb, serves qa) SIGKILLed: P2 takes cb over
            await procs[1].expect("LEADING", 30)
            adding = asyncio.create_task(phase(2))
            procs[0].start()
            await procs[0].ready()
            await adding
            await retry("close", ok.close)
            await retry("close", dies.close)

            async def settled() -> bool:
                kinds = [e["body"]["kind"] for e in await entries() if "body" in e]
                return len(kinds) >= 4

            await until(settled, 90, "four callbacks")
            statuses = {b.id: await retry("status", lambda b=b: app.batch_status(b.id))
                        for b in (ok, dies)}
        log = await entries()
    finally:
        for proc in procs:
            proc.kill()
        await ledger.aclose()
        store.kill()
        store.wait(5)
    want = {ok.id: {"on_success", "on_complete"}, dies.id: {"on_death", "on_complete"}}
    for bid, kinds in want.items():
        fired = [(i, e) for i, e in enumerate(log) if e["job"].startswith(bid + ".")]
        assert sorted(e["body"]["kind"] for _, e in fired) == sorted(kinds), fired
        assert all(e["attempt"] == 1 for _, e in fired)  # each fired once, handled once
        ids = members[bid]
        first_run = {e["job"]: i for i, e in reversed(list(enumerate(log)))
                     if e["job"] in ids}
        total = len(ids)
        dead = 0 if bid == ok.id else 2
        assert len(first_run) == total - dead  # every member that could succeed ran
        for i, e in fired:
            body = e["body"]
            assert body["total"] == total
            if body["kind"] == "on_death":
                assert body["dead"] >= 1
                continue
            # at the right moment: after every member it waited for, with final counts
            assert i > max(first_run.values()), (body["kind"], i, max(first_run.values()))
            assert (body["pending"], body["done"], body["dead"]) == (0, total - dead, dead)
        status = statuses[bid]
        assert (status["total"], status["done"], status["dead"], status["pending"]) == (
            total, total - dead, dead, 0)
        assert {k for k, cb in status["callbacks"].items() if cb["fired_at"]} == kinds
    assert [x for x in procs[1].lines if x in ("LEADING", "STANDBY")][-1] == "LEADING"


@pytest.mark.slow
async def test_ten_thousand_members_in_one_batch() -> None:
    mesh = LocalMesh()
    app = Istos(transport=mesh.transport("n"), request_timeout_s=30.0)
    app.queue("work", lease_s=60.0)
    app.queue("cb")
    done = asyncio.Event()
    bodies: list[dict[str, Any]] = []
    ran: set[int] = set()

    @app.worker("work", concurrency=64, prefetch=64)
    async def member(n: int) -> None:
        ran.add(n)

    @app.worker("cb")
    async def callback(body: dict[str, Any]) -> None:
        bodies.append(body)
        if body["kind"] == "on_complete":
            done.set()

    async with app.serving():
        batch = await app.batch(on_success=("cb", 1), on_complete=("cb", 2))
        for n in range(10_000):
            await batch.add("work", n)
        await batch.close()
        await asyncio.wait_for(done.wait(), 600)
        status = await batch.status()
    assert ran == set(range(10_000))
    assert sorted(b["kind"] for b in bodies) == ["on_complete", "on_success"]
    assert (status["total"], status["done"], status["pending"]) == (10_000, 10_000, 0)
