"""Groups: ``enqueue(..., group=...)``: round-robin between groups, priority first within one,
``group_concurrency`` and ``group_rate_limit`` per group, bounded memory. Pure state, every
storage (with an owner restart), real Zenoh (stats and jobs show groups), the simulator with
its invariant (which can fail)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
import test_durable
from helpers import count, wait_events
from zenoh_util import isolated_configs, unique_prefix

from istos import ConfigError, Istos
from istos.core.config import QueueConfig
from istos.core.groups import Groups
from istos.core.state import QueuePolicy, QueueState
from istos.ops.render import stats_text
from istos.transport.local import LocalMesh
from istos_nb.sim import Simulation

storage_factory = test_durable.storage_factory  # the fixture: memory, Redis, PostgreSQL, SQLite


def _fill(state: QueueState, group: str | None, n: int, now: float = 0.0,
          priority: int = 0) -> None:
    for i in range(n):
        state.enqueue(f"{group}-{priority}-{i}", b"x", now, group=group, priority=priority)


def _claim_groups(state: QueueState, n: int, now: float = 1.0) -> list[str | None]:
    return [r.group for r in state.claim([f"w#{i}" for i in range(n)], now)]


def test_round_robin_between_groups_and_the_ungrouped_jobs():
    state = QueueState("q", QueuePolicy())
    _fill(state, None, 3)
    _fill(state, "flood", 100)
    _fill(state, "small", 2)
    got = _claim_groups(state, 9)
    assert got[:6] == [None, "flood", "small", None, "flood", "small"]
    assert got[6:] == [None, "flood", "flood"]  # small and the ungrouped ran out


def test_priority_first_within_a_group_fifo_after():
    state = QueueState("q", QueuePolicy())
    _fill(state, "a", 2, priority=0)
    _fill(state, "a", 1, priority=5)
    ids = [r.job_id for r in state.claim(["w#0", "w#1", "w#2"], 1.0)]
    assert ids == ["a-5-0", "a-0-0", "a-0-1"]


def test_group_concurrency_caps_leases_and_frees_on_ack():
    state = QueueState("q", QueuePolicy(group_concurrency=2))
    _fill(state, "t1", 10)
    _fill(state, "t2", 10)
    first = state.claim([f"w#{i}" for i in range(8)], 1.0)
    assert sorted(r.group for r in first) == ["t1", "t1", "t2", "t2"]
    assert state.limited  # ready jobs held back by the cap: the owner must not re-nudge
    assert state.claim(["w#9"], 1.0) == [] and state.limited
    rec = first[0]
    state.ack(rec.job_id, rec.lease_token, 2.0)
    (again,) = state.claim(["w#9", "w#10"], 2.0)
    assert again.group == rec.group


def test_group_rate_limit_and_the_refill_time():
    state = QueueState("q", QueuePolicy(group_rate_limit=(2, 10.0)))
    _fill(state, "t1", 5)
    assert len(state.claim(["a", "b", "c"], 0.0)) == 2
    assert state.limited and state.throttled_until(1.0) == 10.0
    assert len(state.claim(["a", "b", "c"], 10.0)) == 2


def test_memory_per_group_is_dropped_when_it_is_empty():
    state = QueueState("q", QueuePolicy())
    for g in range(500):
        _fill(state, f"g{g}", 1)
    groups = state.heaps.groups
    assert isinstance(groups, Groups) and len(groups) == 500
    for rec in state.claim([f"w#{i}" for i in range(500)], 1.0):
        state.ack(rec.job_id, rec.lease_token, 1.0)
    assert state.claim(["w"], 2.0) == []
    assert len(groups) == 0 and len(groups.ring) == 0


def test_declaration_and_enqueue_check_the_options():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="group_concurrency"):
            QueueConfig.build("q", group_concurrency=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="group_rate_limit"):
        QueueConfig.build("q", group_rate_limit=(0, 1.0))
    app = Istos(transport=LocalMesh().transport("p"))
    for bad in ("", 5, "x" * 129):
        with pytest.raises(ConfigError, match="group"):
            asyncio.run(app.enqueue("q", 1, group=bad))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="groups has 1 entries for 2 items"):
        asyncio.run(app.enqueue_many("q", [1, 2], groups=["a"]))


async def _tenants(owner: Istos, worker: Istos, flood: int, small: int, timeout_s: float
                   ) -> tuple[list[str], dict[str, Any]]:
    order: list[str] = []
    gate = asyncio.Event()

    @worker.worker("q", concurrency=4, poll_interval_s=0.1)
    async def handle(job):
        order.append(job["t"])
        if job["t"] == "flood" and not gate.is_set():
            await asyncio.sleep(0)

    async with owner.serving():
        await owner.enqueue_many("q", [{"t": "flood"}] * flood, groups=["flood"] * flood)
        for _ in range(small):
            await owner.enqueue("q", {"t": "small"}, group="small")
        stats = (await owner.client("q").call("stats"))["stats"]
        async with worker.serving():
            await wait_events(owner, lambda ev: count(ev, "acked") == flood + small, timeout_s)
    return order, stats


async def test_a_flooding_tenant_does_not_starve_a_small_one_on_every_storage(storage_factory):
    mesh = LocalMesh()
    owner = Istos(storage=storage_factory(), transport=mesh.transport("owner"))
    owner.queue("q", group_concurrency=2)
    worker = Istos(transport=mesh.transport("w"))
    order, stats = await _tenants(owner, worker, 200, 5, 30.0)
    # FIFO would run the 200 flood jobs first; round-robin serves the small tenant at once
    assert max(i for i, t in enumerate(order) if t == "small") < 20, order[:30]
    assert stats["groups"]["count"] == 2 and stats["groups"]["concurrency"] == 2
    assert stats["groups"]["busiest"][0] == {"group": "flood", "ready": 200, "leased": 0}
    assert "groups  2 (ready/leased: flood 200/0  small 5/0)  cap 2" in stats_text(stats)
    if not owner.node.storage.durable:
        return
    again = Istos(storage=storage_factory(), transport=mesh.transport("owner-2"))
    again.queue("q", group_concurrency=1)
    async with again.serving():  # a restart reloads each job's group
        await again.enqueue_many("q", [1, 2, 3], groups=["a", "a", "b"], job_ids=["1", "2", "3"])
    third = Istos(storage=storage_factory(), transport=mesh.transport("owner-3"))
    third.queue("q", group_concurrency=1)
    async with third.serving():
        state = third.owners["q"].state
        assert {r.group for r in state.jobs.values()} == {"a", "b"}
        assert sorted(r.group for r in state.claim(["x", "y", "z"], 0.0)) == ["a", "b"]


async def test_groups_over_zenoh_show_in_stats_and_jobs():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q", group_concurrency=1)
    producer = Istos(zenoh=configs[1], prefix=prefix, node_id="producer")
    async with owner.serving(), producer.serving():
        await producer.enqueue_many("q", [1, 2, 3], groups=["t-é", None, "t-é"])
        await producer.enqueue("q", 4, group="other")
        client = producer.client("q")
        stats = (await client.call("stats"))["stats"]
        jobs = (await client.call("jobs"))["jobs"]
        claimed = (await client.call("claim", workers=["w#0", "w#1", "w#2", "w#3"],
                                     node="w"))["jobs"]
    assert stats["groups"]["count"] == 2
    assert {r["group"]: r["ready"] for r in stats["groups"]["busiest"]} == {"t-é": 2, "other": 1}
    assert sorted(j.get("group") or "-" for j in jobs) == ["-", "other", "t-é", "t-é"]
    assert len(claimed) == 3  # one of t-é (its cap), the ungrouped one, other's one


def _tenant_sim(seed: int) -> Simulation:
    sim = Simulation(seed=seed, storage="durable")
    owner = sim.node("owner")
    owner.queue("q", group_concurrency=2, group_rate_limit=(5, 1.0), lease_s=5.0)
    for name in ("a", "b"):
        node = sim.node(name, clock_skew_s=0.2)

        @node.worker("q", concurrency=4)
        async def handle(job):
            await asyncio.sleep(0.1)

    rng = random.Random(seed)
    for i in range(150):
        sim.at(rng.uniform(0, 5), owner.enqueue, "q", {"i": i}, group="flood")
    for i in range(10):
        sim.at(2.0 + i, owner.enqueue, "q", {"i": i}, group="small")
    sim.restart("owner", at=12.0)
    return sim


def test_simulated_groups_hold_their_limits():
    result = _tenant_sim(4).run(until=120.0)
    report = result.check().set_index("invariant")
    assert report["ok"].all(), report
    assert report.loc["group limits held", "detail"] == "ok"
    assert len(result.effects) == 160 and result.counts["lost"] == 0


def test_checker_catches_an_owner_that_ignores_group_limits(monkeypatch):
    monkeypatch.setattr(Groups, "_blocked", lambda self, group, now: False)
    report = _tenant_sim(4).run(until=120.0).check().set_index("invariant")
    assert not report.loc["group limits held", "ok"]


async def test_a_settled_job_wakes_the_workers_its_group_cap_held_back():
    mesh = LocalMesh()
    owner = Istos(transport=mesh.transport("owner"))
    owner.queue("q", group_concurrency=1)
    workers = [Istos(transport=mesh.transport(f"w{i}")) for i in range(2)]
    for app in workers:
        @app.worker("q", concurrency=2, poll_interval_s=60.0)  # only nudges wake them
        async def handle(job):
            await asyncio.sleep(0.01)

    async with owner.serving():
        for app in workers:
            await app.start()
        try:
            await owner.enqueue_many("q", list(range(12)), groups=["one"] * 12)
            # one at a time (the cap), each ack freeing the slot for a held-back worker
            events = await wait_events(owner, lambda ev: count(ev, "acked") == 12, 30.0)
        finally:
            for app in workers:
                await app.stop()
    claims = [e for e in events if e.kind == "claimed"]
    acks = [e for e in events if e.kind == "acked"]
    assert all(c.t >= a.t for c, a in zip(claims[1:], acks))  # never two leased at once
