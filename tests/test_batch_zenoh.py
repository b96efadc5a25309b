"""Batches over real Zenoh sessions and durable storage (Redis, PostgreSQL): three queues on
three owner nodes, one owner killed mid-batch and restarted; every callback exactly once,
counts from a ledger."""

from __future__ import annotations

import asyncio
import io
import json
import uuid
from typing import Any

import pytest
from services import drop_postgres_table, free_port, postgres_url, redis_url
from zenoh_util import isolated_configs, peer_config, unique_prefix

from istos import Istos, RedisStoragePlugin, SQLAlchemyStoragePlugin
from istos.ops.cli import parser, run

MEMBERS = 60


class Ledger:
    """What the handlers saw, kept outside every app: members run, callbacks received."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.callbacks: list[dict[str, Any]] = []
        self.changed = asyncio.Event()
        # Members that start once a quarter has run wait here until the test opens it (after
        # the kill and the restart): the kill lands mid-batch however fast the rest would run.
        self.gate = asyncio.Event()

    def note(self) -> None:
        self.changed.set()

    async def until(self, pred: Any, timeout_s: float, what: str) -> None:
        async def wait() -> None:
            while not pred():
                self.changed.clear()
                await self.changed.wait()
        try:
            await asyncio.wait_for(wait(), timeout_s)
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {what}: {len(set(self.runs))} "
                                 f"members ran, callbacks {self.callbacks}") from None


def storage(kind: str, ns: str) -> Any:
    if kind == "redis":
        return RedisStoragePlugin(redis_url(), key_prefix=ns)
    return SQLAlchemyStoragePlugin(postgres_url(), table=ns.replace("-", "_"))


def node(config: dict[str, Any], prefix: str, name: str, ns: str, ledger: Ledger,
         queues: tuple[str, ...], kind: str = "redis") -> Istos:
    app = Istos(storage(kind, ns), zenoh=config, prefix=prefix, node_id=name,
                request_timeout_s=1.0)
    for q in queues:
        app.queue(q, lease_s=1.0, max_attempts=50)
        if q == "cb":
            @app.worker("cb")
            async def callback(body: dict[str, Any]) -> None:
                ledger.callbacks.append(body)
                ledger.note()
        else:
            @app.worker(q, concurrency=2)
            async def member(n: int, ctx: Any) -> int:
                ledger.runs.append(ctx.job_id)
                ledger.note()
                if len(set(ledger.runs)) >= MEMBERS // 4:
                    await ledger.gate.wait()  # (see Ledger.gate)
                return n
    return app


@pytest.mark.parametrize(("victim", "kind"), [
    pytest.param("home", "redis", marks=pytest.mark.redis),
    pytest.param("b", "redis", marks=pytest.mark.redis),
    pytest.param("home", "postgres", marks=pytest.mark.postgres)])
async def test_batch_across_three_owner_nodes_with_one_killed_and_restarted(victim: str,
                                                                            kind: str):
    """The home (counts, callbacks) or a member queue's owner (reports) dies mid-batch."""
    configs, prefix, ns = isolated_configs(4), unique_prefix(), f"batch-{uuid.uuid4().hex[:8]}"
    ledger = Ledger()
    served = {"home": ("cb", "qa"), "b": ("qb",), "c": ("qc",)}
    apps = {name: node(configs[i], prefix, name, ns, ledger, queues, kind)
            for i, (name, queues) in enumerate(served.items())}
    producer = Istos(zenoh=configs[3], prefix=prefix, node_id="producer", request_timeout_s=5.0)
    endpoints = [cfg["listen"]["endpoints"][0] for cfg in configs]
    try:
        for app in apps.values():
            await app.start()
        async with producer.serving():
            batch = await producer.batch(on_success=("cb", "ok"), on_complete=("cb", "all"),
                                         on_death=("cb", "dead"), description="three owners")
            ids = [await batch.add(f"q{'abc'[n % 3]}", n) for n in range(MEMBERS)]
            await batch.close()
            await ledger.until(lambda: len(set(ledger.runs)) >= MEMBERS // 4, 20,
                               "a quarter of the members")
            dying = apps[victim]
            dying.kill()  # mid-batch: what it held comes back from Redis after the restart
            assert dying.node.transport is not None
            await dying.node.transport.close()  # its session dies with it, as with SIGKILL
            assert len(set(ledger.runs)) < MEMBERS
            index = list(served).index(victim)
            fresh = f"tcp/127.0.0.1:{free_port()}"
            apps[victim] = node(peer_config(fresh, [
                e for i, e in enumerate(endpoints) if i != index]),
                prefix, f"{victim}2", ns, ledger, served[victim], kind)
            endpoints[index] = fresh  # (the operator below connects to the live nodes)
            await apps[victim].start()
            ledger.gate.set()
            await ledger.until(lambda: {cb["kind"] for cb in ledger.callbacks}
                               >= {"on_complete", "on_success"}, 60, "both callbacks")
            status = await producer.batch_status(batch.id)
            members = await producer.client("cb").call("batch_members", batch_id=batch.id)
            shown = await cli(["batch", batch.id, "--state", "done", "--limit", "5"], endpoints,
                              prefix)
            listed = await cli(["batches", "cb"], endpoints, prefix)
    finally:
        for app in apps.values():
            await app.stop()
        if kind == "redis":
            store = RedisStoragePlugin(redis_url(), key_prefix=ns)
            await store.open()
            await store.wipe()
            await store.close()
        else:
            await drop_postgres_table(postgres_url(), ns.replace("-", "_"))
    assert set(ledger.runs) == set(ids)  # the ledger: every member ran (some twice)
    assert sorted(cb["kind"] for cb in ledger.callbacks) == ["on_complete", "on_success"]
    for cb in ledger.callbacks:
        assert (cb["total"], cb["done"], cb["dead"], cb["pending"]) == (MEMBERS, MEMBERS, 0, 0)
    assert (status["total"], status["done"], status["pending"]) == (MEMBERS, MEMBERS, 0)
    assert status["callbacks"]["on_death"]["fired_at"] is None
    assert {m["job_id"] for m in members["members"]} == set(ids)
    assert {m["state"] for m in members["members"]} == {"done"}
    assert f"{MEMBERS} members: 0 pending, {MEMBERS} done" in shown
    assert "on_success -> cb (fired" in shown and "on_death -> cb (not fired)" in shown
    assert batch.id in listed and "finished" in listed and "three owners" in listed


async def cli(argv: list[str], endpoints: list[str], prefix: str) -> str:
    """Run an ``istos`` command in-process, its session a peer of the test's mesh."""
    config = json.dumps(peer_config(f"tcp/127.0.0.1:{free_port()}", endpoints))
    args = parser().parse_args([*argv, "--zenoh", config, "--prefix", prefix])
    out = io.StringIO()
    assert await run(args, out) == 0
    return out.getvalue()
