"""The simulator honours unique keys and debounce (it runs the engine), and its checker proves
"never two jobs holding one unique key within its scope" over many seeds, across an owner
restart on durable storage; the invariant can fail (an owner that never finds a holder)."""

from __future__ import annotations

import asyncio

import pytest

from istos_nb.sim import Simulation

SCOPES = ("queued", "active", "finished")


def _keyed_sim(seed: int, storage: str = "durable") -> Simulation:
    sim = Simulation(seed=seed, storage=storage)
    owner = sim.node("owner")
    owner.queue("q", lease_s=5.0, max_attempts=3)
    w = sim.node("w")

    @w.worker("q", concurrency=2)
    async def handle(job):
        await asyncio.sleep(0.7)

    for i in range(60):
        key = f"k{i % 4}"
        scope = SCOPES[i % 3]
        t = 0.4 * i + 0.05 * (seed % 7)  # the seed also shifts the sends against the runs
        kw = {"unique_key": key, "unique": scope}
        if scope == "finished":
            kw["unique_s"] = 2.0
        sim.at(t, owner.enqueue, "q", {"i": i}, **kw)
    for i in range(10):  # a burst: one run with the last data
        sim.at(1.0 + 0.1 * i, owner.enqueue, "q", {"burst": i}, debounce_key="b",
               debounce_s=0.5, debounce_max_s=3.0)
    sim.restart("owner", at=12.13)
    return sim


@pytest.mark.parametrize("seeds", [range(0, 100), range(100, 200)])
def test_simulated_unique_keys_hold_over_200_seeds_and_a_restart(seeds):
    for seed in seeds:
        _check_seed(seed)


def _check_seed(seed: int) -> None:
    result = _keyed_sim(seed).run(until=60.0)
    report = result.check().set_index("invariant")
    assert report["ok"].all(), report[~report["ok"]]
    assert report.loc["never two jobs holding one unique key within its scope", "ok"]
    assert result.counts["lost"] == 0 and result.counts["duplicated"] == 0
    kinds = [(e["kind"], e["job_id"]) for e in result.events_raw]
    burst = {j for k, j in kinds if k == "updated"}  # the burst's 9 later calls: one job
    assert len(burst) == 1 and kinds.count(("acked", next(iter(burst)))) == 1
    assert sum(1 for k, _ in kinds if k == "duplicate_enqueue") > 0


def test_checker_catches_a_second_holder(monkeypatch):
    from istos.core.unique import UniqueKeys

    monkeypatch.setattr(UniqueKeys, "holder", lambda self, key, jobs, now: None)
    report = _keyed_sim(3).run(until=60.0).check().set_index("invariant")
    assert not report.loc["never two jobs holding one unique key within its scope", "ok"]
