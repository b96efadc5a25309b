"""Dependencies over real Zenoh sessions and durable storage (Redis, PostgreSQL): a child on a
third node waits for two parents on two queues owned by two other nodes; its owner is killed
and restarted while it waits; each on_parent_failure mode with a dead parent. Runs come from a
ledger kept outside every app."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from helpers import count, wait_events
from services import drop_postgres_table, free_port, postgres_url, redis_url
from zenoh_util import isolated_configs, peer_config, unique_prefix

from istos import Istos, RedisStoragePlugin, SQLAlchemyStoragePlugin


class Ledger:
    """What the handlers ran, in order; the parents wait at ``gate`` until the test opens it."""

    def __init__(self) -> None:
        self.runs: list[str] = []
        self.changed = asyncio.Event()
        self.gate = asyncio.Event()

    def note(self, what: str) -> None:
        self.runs.append(what)
        self.changed.set()

    async def until(self, pred: Any, timeout_s: float, what: str) -> None:
        async def wait() -> None:
            while not pred():
                self.changed.clear()
                await self.changed.wait()
        try:
            await asyncio.wait_for(wait(), timeout_s)
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {what}: ran {self.runs}") from None


def storage(kind: str, ns: str) -> Any:
    if kind == "redis":
        return RedisStoragePlugin(redis_url(), key_prefix=ns)
    return SQLAlchemyStoragePlugin(postgres_url(), table=ns.replace("-", "_"))


async def wipe(kind: str, ns: str) -> None:
    if kind == "redis":
        store = RedisStoragePlugin(redis_url(), key_prefix=ns)
        await store.open()
        await store.wipe()
        await store.close()
    else:
        await drop_postgres_table(postgres_url(), ns.replace("-", "_"))


def node(config: dict[str, Any], prefix: str, name: str, ns: str, ledger: Ledger,
         queue: str, kind: str) -> Istos:
    app = Istos(storage(kind, ns), zenoh=config, prefix=prefix, node_id=name,
                request_timeout_s=1.0)
    app.queue(queue, lease_s=2.0, max_attempts=1, admin=True)

    @app.worker(queue)
    async def handler(data: str) -> None:
        if queue != "c":
            await ledger.gate.wait()
        ledger.note(data)
        if data.startswith("fail"):
            raise RuntimeError(f"{data} fails")

    return app


@pytest.mark.parametrize("kind", [pytest.param("redis", marks=pytest.mark.redis),
                                  pytest.param("postgres", marks=pytest.mark.postgres)])
async def test_two_parents_on_two_owner_nodes_and_the_child_owner_restarted_while_it_waits(
        kind: str):
    configs, prefix, ns = isolated_configs(4), unique_prefix(), f"deps-{uuid.uuid4().hex[:8]}"
    ledger = Ledger()
    served = {"na": "a", "nb": "b", "nc": "c"}
    apps = {name: node(configs[i], prefix, name, ns, ledger, q, kind)
            for i, (name, q) in enumerate(served.items())}
    producer = Istos(zenoh=configs[3], prefix=prefix, node_id="producer", request_timeout_s=5.0)
    endpoints = [cfg["listen"]["endpoints"][0] for cfg in configs]
    try:
        for app in apps.values():
            await app.start()
        async with producer.serving():
            first = await producer.enqueue("a", "parent-a")
            second = await producer.enqueue("b", "parent-b")
            child = await producer.enqueue("c", "child", after=[first, ("b", second)])
            waiting = await producer.result("c", child)
            dying = apps["nc"]
            dying.kill()  # the child's owner dies while the child waits
            assert dying.node.transport is not None
            await dying.node.transport.close()
            ledger.gate.set()  # the parents end while it is down: their reports are retried
            await ledger.until(lambda: {"parent-a", "parent-b"} <= set(ledger.runs), 20,
                               "both parents")
            fresh = f"tcp/127.0.0.1:{free_port()}"
            apps["nc"] = node(peer_config(fresh, endpoints[:2] + endpoints[3:]), prefix,
                              "nc2", ns, ledger, "c", kind)
            await apps["nc"].start()
            await ledger.until(lambda: "child" in ledger.runs, 30, "the child")
            events = [e for e in apps["nc"].events.recent() if e.job_id == child]
            done = await producer.result("c", child)
    finally:
        for app in apps.values():
            await app.stop()
        await wipe(kind, ns)
    assert waiting["state"] == "waiting"
    assert ledger.runs.count("child") == 1  # released exactly once
    assert ledger.runs.index("child") > max(ledger.runs.index("parent-a"),
                                            ledger.runs.index("parent-b"))
    assert [e.kind for e in events].count("unblocked") == 1
    assert done["state"] in ("done", "unknown")


@pytest.mark.redis
async def test_a_dead_parent_on_another_node_in_each_mode():
    configs, prefix, ns = isolated_configs(3), unique_prefix(), f"deps-{uuid.uuid4().hex[:8]}"
    ledger = Ledger()
    parents = node(configs[0], prefix, "np", ns, ledger, "p", "redis")
    children = node(configs[1], prefix, "nc", ns, ledger, "c", "redis")
    producer = Istos(zenoh=configs[2], prefix=prefix, node_id="producer", request_timeout_s=5.0)
    try:
        await parents.start()
        await children.start()
        async with producer.serving():
            dies = await producer.enqueue("p", "fail-parent")
            kids = {mode: await producer.enqueue("c", f"child-{mode}", after=[dies],
                                                 on_parent_failure=mode)
                    for mode in ("cancel", "run", "wait")}
            ledger.gate.set()
            await ledger.until(lambda: "child-run" in ledger.runs, 20, "the run child")

            await wait_events(children, lambda evs: count(evs, "cancelled", kids["cancel"]) == 1,
                              timeout_s=20)

            async def state(mode: str) -> str:
                return str((await producer.result("c", kids[mode]))["state"])

            cancelled, waiting = await state("cancel"), await state("wait")
            why = (await producer.client("c").call("why", job_id=kids["wait"]))["why"]
    finally:
        await parents.stop()
        await children.stop()
        await wipe("redis", ns)
    assert cancelled == "cancelled" and waiting == "waiting"
    assert why["waits_for"]["needs_operator"] is True
    assert why["waits_for"]["parents"] == [{"queue": "p", "job_id": dies, "state": "dead"}]
    assert "child-cancel" not in ledger.runs and "child-wait" not in ledger.runs
    assert ledger.runs.count("child-run") == 1
