"""Rate limits: ``app.queue(name, rate_limit=(n, per_s))``: at most ``n`` claims in any ``per_s``
seconds across all workers; throttled workers are nudged when tokens return (no busy polling).
Pure bucket, in-process on every storage, over real Zenoh with two worker nodes, stats and
metrics, and the simulator with its invariant (which can fail)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import test_durable
from helpers import count, wait_events
from zenoh_util import isolated_configs, unique_prefix

from istos import ConfigError, Istos, JobEvent
from istos.core.config import QueueConfig
from istos.core.ratelimit import TokenBucket
from istos.core.state import QueuePolicy, QueueState
from istos.ops.metrics import QueueCollector
from istos.ops.render import stats_text
from istos.transport.local import LocalMesh
from istos_nb.sim import Simulation

storage_factory = test_durable.storage_factory  # the fixture: memory, Redis, PostgreSQL, SQLite


def within_limit(times: list[float], n: int, per_s: float, slack: float = 1e-6) -> bool:
    """No ``n + 1`` of ``times`` inside one window of ``per_s`` seconds."""
    times = sorted(times)
    return all(times[i + n] - times[i] >= per_s - slack for i in range(len(times) - n))


def test_bucket_is_a_sliding_window_not_a_drip():
    bucket = TokenBucket(3, 1.0)
    assert bucket.available(0.0) == 3
    bucket.spend(2, 0.0)
    bucket.spend(1, 0.5)
    assert bucket.available(0.99) == 0 and bucket.next_token_at(0.99) == 1.0
    assert bucket.available(1.0) == 2  # the two spent at 0 are back, not the one at 0.5
    bucket.spend(2, 1.0)
    assert bucket.available(1.49) == 0 and bucket.available(1.5) == 1
    assert bucket.available(0.2) == 3 - bucket._out  # a clock stepping back never adds


def test_declaration_checks_the_limit():
    for bad in ((0, 1.0), (1.5, 1.0), (10, 0), (10, float("inf")), (10,), "10/s", (True, 1)):
        with pytest.raises(ConfigError, match="rate_limit"):
            QueueConfig.build("q", rate_limit=bad)  # type: ignore[arg-type]
    assert QueueConfig.build("q", rate_limit=(10, 1)).policy.rate_limit == (10, 1.0)
    assert QueueConfig.build("q").policy.rate_limit is None


def test_pure_claims_stop_at_the_limit_and_count_throttled_slots():
    state = QueueState("q", QueuePolicy(rate_limit=(2, 1.0)))
    for i in range(5):
        state.enqueue(f"j{i}", b"x", 0.0)
    assert len(state.claim(["a", "b", "c"], 0.0)) == 2
    assert state.limiter is not None and state.limiter.throttled == 1
    assert state.throttled_until(0.5) == 1.0
    assert state.claim(["a"], 0.5) == [] and state.limiter.throttled == 2
    assert len(state.claim(["a", "b", "c"], 1.0)) == 2
    assert state.throttled_until(1.0) == 2.0
    assert QueueState("q", QueuePolicy()).throttled_until(0.0) is None


def _claim_times(events: list[JobEvent]) -> list[float]:
    return [e.t for e in events if e.kind == "claimed"]


async def _limited_run(owner: Istos, workers: list[Istos], jobs: int, timeout_s: float,
                       concurrency: int = 8) -> list[JobEvent]:
    for app in workers:
        @app.worker("api", concurrency=concurrency, poll_interval_s=60.0)  # only nudges wake it
        async def call(job: Any) -> None:
            await asyncio.sleep(0)

    async with owner.serving():
        for app in workers:
            await app.start()
        try:
            ids = await owner.enqueue_many("api", list(range(jobs)))
            events = await wait_events(owner, lambda ev: count(ev, "acked") == jobs,
                                       timeout_s)
        finally:
            for app in workers:
                await app.stop()
    assert len(ids) == jobs
    return events


async def test_limit_holds_and_refill_nudges_wake_the_workers(storage_factory):
    mesh = LocalMesh()
    owner = Istos(storage=storage_factory(), transport=mesh.transport("owner"))
    owner.queue("api", rate_limit=(5, 0.5))
    workers = [Istos(transport=mesh.transport(f"w{i}")) for i in range(2)]
    events = await _limited_run(owner, workers, 20, 30.0)
    times = _claim_times(events)
    assert within_limit(times, 5, 0.5)
    # poll_interval_s=60: the jobs could only finish this soon because the owner nudged
    # the throttled workers when tokens came back (and only then: few empty claims).
    assert max(times) - min(times) < 20.0
    claims = sum(r.stats.claims for app in workers for r in app.runners)
    assert claims <= 3 * 20 // 5 + 6, claims


async def test_limit_across_two_worker_nodes_over_zenoh():
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("api", rate_limit=(4, 0.5))
    workers = [Istos(zenoh=configs[i], prefix=prefix, node_id=f"w{i}") for i in (1, 2)]
    # two slots each, four tokens: the limit is the owner's, whichever node claims
    events = await _limited_run(owner, workers, 16, 60.0, concurrency=2)
    assert within_limit(_claim_times(events), 4, 0.5)


async def test_stats_and_metrics_show_the_limiter():
    mesh = LocalMesh()
    owner = Istos(transport=mesh.transport("owner"))
    owner.queue("api", rate_limit=(2, 3600.0))
    owner.queue("free")

    class Stats:  # the collector's calls, answered by the real owner
        async def stats(self, queue: str) -> dict[str, Any]:
            return (await owner.client(queue).call("stats"))["stats"]

        async def workers(self, queue: str) -> list[dict[str, Any]]:
            return (await owner.client(queue).call("workers"))["workers"]

        async def call(self, queue: str, op: str, **fields: Any) -> dict[str, Any]:
            return await owner.client(queue).call(op, **fields)

    async with owner.serving():
        await owner.enqueue_many("api", [1, 2, 3])
        reply = await owner.client("api").call("claim", workers=["w#0", "w#1", "w#2"],
                                               node="w")
        assert len(reply["jobs"]) == 2 and not reply.get("more")
        stats = (await owner.client("api").call("stats"))["stats"]
        assert stats["rate_limit"] == {"n": 2, "per_s": 3600.0, "tokens": 0, "throttled": 1}
        assert stats["policy"]["rate_limit"] == [2, 3600.0]
        assert "limit   2 claims per 3600 s  tokens 0  throttled 1" in stats_text(stats)
        free = (await owner.client("free").call("stats"))["stats"]
        assert "rate_limit" not in free and "rate_limit" not in free["policy"]
        collector = QueueCollector(Stats(), ["api", "free"],  # type: ignore[arg-type]
                                   asyncio.get_running_loop(), 5.0)
        families = await asyncio.to_thread(lambda: list(collector.collect()))
    samples = {(s.name, s.labels["queue"]): s.value for f in families for s in f.samples}
    assert samples[("istos_throttled_total", "api")] == 1.0
    assert samples[("istos_throttled_total", "free")] == 0.0


def _limited_sim(seed: int) -> Simulation:
    sim = Simulation(seed=seed, storage="durable")  # the restart keeps the jobs
    owner = sim.node("owner")
    owner.queue("api", rate_limit=(10, 1.0), lease_s=5.0)
    for name in ("a", "b", "c"):
        node = sim.node(name, clock_skew_s=0.3)

        @node.worker("api", concurrency=6)
        async def call(job):
            await asyncio.sleep(0.05)

    sim.enqueue_jobs("owner", "api", 200, rate=40.0)
    sim.restart("owner", at=8.0)
    return sim


def test_simulated_limit_is_never_exceeded():
    result = _limited_sim(11).run(until=60.0)
    report = result.check().set_index("invariant")
    assert report["ok"].all(), report
    assert report.loc["claims within the rate limit", "detail"] == "ok"
    claims = [e["t"] for e in result.events_raw if e["kind"] == "claimed"]
    assert len(claims) >= 200 and max(claims) >= 19.0  # 200 jobs at 10/s: the limit bit


def test_checker_catches_an_owner_that_ignores_the_limit(monkeypatch):
    monkeypatch.setattr(TokenBucket, "available", lambda self, now: 1 << 30)
    report = _limited_sim(11).run(until=60.0).check().set_index("invariant")
    assert not report.loc["claims within the rate limit", "ok"]
