"""One tick per slot however many nodes declare a schedule: epoch-anchored grids, slot ids
identical across nodes, and the owner's memory of recent slots (istos.core.slots), checked on
pure parts, on the in-process mesh, and in the simulator with skewed and drifting clocks."""

from __future__ import annotations

import asyncio
from datetime import timezone

import pytest
from helpers import count, wait_events
from services import free_port, start_throwaway_redis

from istos import ConfigError, Istos, codec
from istos.clock import ManualClock
from istos.core.slots import MIN_HOLD_S, RecentSlots, hold_s
from istos.errors import ProtocolError, StorageUnavailable
from istos.features.schedule import Schedule
from istos.transport.local import LocalMesh
from istos_nb.sim import Simulation
from istos_nb.sim.clock import SIM_EPOCH


def interval(every_s: float, offset_s: float = 0.0, delay: float = 0.0) -> Schedule:
    return Schedule("s", "q", {}, every_s, None, timezone.utc, delay, offset_s)


# -- the grid --

def test_interval_grid_is_anchored_at_the_epoch_plus_offset() -> None:
    hourly = interval(3600)
    assert hourly.first_slot(7200.0) == 7200.0  # on a grid point: that point
    assert hourly.first_slot(7200.5) == 10800.0
    assert hourly.next_slot(7200.0) == 10800.0  # strictly after
    shifted = interval(3600, offset_s=900)
    assert shifted.first_slot(7200.5) == 8100.0
    assert interval(60, delay=90).first_slot(1000.0) == 1140.0  # first grid point >= now+delay
    # Two nodes starting at different times compute the same slots and ids.
    a, b = interval(0.1), interval(0.1)
    slots_a = [a.first_slot(1_767_225_600.013)]
    slots_b = [b.first_slot(1_767_225_601.337)]
    for _ in range(30):
        slots_a.append(a.next_slot(slots_a[-1]))
    assert slots_b[0] in slots_a
    assert a.job_id(slots_b[0]) in {a.job_id(x) for x in slots_a}


def test_offset_and_declaration_errors() -> None:
    app = Istos(transport=LocalMesh().transport("x"))
    with pytest.raises(ConfigError, match="offset_s"):
        app.schedule("q", {}, cron="0 * * * *", offset_s=5)
    with pytest.raises(ConfigError, match="offset_s"):
        app.schedule("q", {}, every_s=60, offset_s=60)
    with pytest.raises(ConfigError, match="offset_s"):
        app.schedule("q", {}, every_s=60, offset_s=-1)
    assert app.schedule("q", {}, every_s=60, offset_s=15) == "q@60s+15"
    assert app.schedule("q", {}, every_s=60) == "q@60s"


# -- the owner's memory --

def test_recent_slots_expire_after_the_hold_and_stay_bounded() -> None:
    recent = RecentSlots(capacity=3)
    recent.remember("a", 0.0, 10.0)  # held max(20, 60) = 60 s
    assert hold_s(10.0) == MIN_HOLD_S and hold_s(3600.0) == 7200.0
    assert recent.seen("a", 59.9) and not recent.seen("a", 60.0)
    for i, name in enumerate("bcde"):
        recent.remember(name, 100.0 + i, 1000.0)
    assert len(recent) == 3 and not recent.seen("b", 101.0)  # the soonest to expire went
    recent.remember("c", 200.0, 1000.0)  # remembering again extends, never shortens
    assert recent.seen("c", 2150.0)
    with pytest.raises(ValueError, match="period"):
        recent.remember("x", 0.0, float("nan"))


async def test_owner_refuses_a_slot_again_after_its_job_finished() -> None:
    clock = ManualClock(1000.0)
    mesh = LocalMesh()
    owner = Istos(transport=mesh.transport("owner"), clock=clock)
    owner.queue("q")
    done: list[object] = []

    @owner.worker("q")
    async def work(data: object) -> None:
        done.append(data)

    producer = Istos(transport=mesh.transport("producer"), clock=clock)
    body = codec.encode_body({"n": 1}, queue="q")

    async def tick(job_id: str) -> dict:
        return await producer.client("q").call("enqueue_slot", body=body, job_id=job_id,
                                               period_s=10.0)

    async with owner.serving(), producer.serving():
        assert (await tick("sched:s:1000"))["created"] is True
        await wait_events(owner, lambda ev: count(ev, "acked") == 1)
        assert owner.owners["q"].state.jobs.get("sched:s:1000") is None  # finished, gone
        assert (await tick("sched:s:1000"))["created"] is False  # a second node, 1.3 s late
        clock.t += MIN_HOLD_S
        assert (await tick("sched:s:1000"))["created"] is True  # the hold has passed
        await wait_events(owner, lambda ev: count(ev, "acked") == 2)
        with pytest.raises(ProtocolError, match="period_s"):
            await producer.client("q").call("enqueue_slot", body=body, job_id="sched:s:x",
                                            period_s=0)
    assert count(owner.events.recent(), "enqueued") == 2 and len(done) == 2


async def test_a_restarted_durable_owner_still_refuses_a_finished_slot(tmp_path) -> None:
    """The slot memory survives the owner (failover or restart) when the storage is durable:
    marks are written after the job and swept once their hold has passed."""
    from istos import SQLAlchemyStoragePlugin
    from istos.owner.persistence import slot_marks

    clock = ManualClock(1000.0)
    url = f"sqlite+aiosqlite:///{tmp_path / 'slots.db'}"
    body = codec.encode_body({"n": 1}, queue="q")
    done: list[object] = []

    def owner_app(name: str) -> Istos:
        app = Istos(storage=SQLAlchemyStoragePlugin(url), transport=mesh.transport(name),
                    clock=clock)
        app.queue("q")

        @app.worker("q")
        async def work(data: object) -> None:
            done.append(data)

        return app

    async def tick(app: Istos, job_id: str) -> bool:
        reply = await app.client("q").call("enqueue_slot", body=body, job_id=job_id,
                                           period_s=10.0)
        return bool(reply["created"])

    mesh = LocalMesh()
    first = owner_app("first")
    async with first.serving():
        assert await tick(first, "sched:s:1000") is True
        await wait_events(first, lambda ev: count(ev, "acked") == 1)
    second = owner_app("second")  # a new owner on the same storage, its RAM empty
    async with second.serving():
        assert "sched:s:1000" not in second.owners["q"].state.jobs  # finished and gone
        assert await tick(second, "sched:s:1000") is False  # the mark remembers it
        clock.t += MIN_HOLD_S
        assert await tick(second, "sched:s:1000") is True  # the hold has passed
        await wait_events(second, lambda ev: count(ev, "acked") == 1)
        marks = slot_marks.SlotMarks(second.node.storage, "q")
        clock.t += MIN_HOLD_S
        assert await marks.purge(clock.now()) == 1  # the expired mark is swept
        assert await second.node.storage.scan("slots:q") == []
    assert len(done) == 2


@pytest.mark.redis
async def test_a_slot_refused_by_a_storage_outage_is_not_remembered() -> None:
    """Write, then apply: the slot is remembered only once its job is stored, so the other
    node's tick of the same slot (or a retry) still gets it in after the outage."""
    from istos.storage.redis import RedisStoragePlugin

    port = free_port()
    proc = start_throwaway_redis(port)  # our own server: this test kills it
    mesh = LocalMesh()
    storage = RedisStoragePlugin(f"redis://127.0.0.1:{port}/0", op_timeout_s=0.5,
                                 connect_timeout_s=0.5)
    owner = Istos(storage=storage, transport=mesh.transport("owner"))
    owner.queue("q")
    body = codec.encode_body({}, queue="q")
    try:
        async with owner.serving():
            client = owner.client("q")
            proc.kill()
            proc.wait(5)
            with pytest.raises(StorageUnavailable):
                await client.call("enqueue_slot", body=body, job_id="sched:s:60", period_s=60.0)
            proc = start_throwaway_redis(port)
            reply = await client.call("enqueue_slot", body=body, job_id="sched:s:60",
                                      period_s=60.0)
            assert reply["created"] is True
            assert "sched:s:60" in owner.owners["q"].state.jobs
    finally:
        proc.kill()
        proc.wait(5)


# -- the simulator: several nodes, skewed and drifting clocks --

def _two_beats_sim(**schedule: object) -> Simulation:
    sim = Simulation(seed=16)
    owner = sim.node("owner")
    owner.queue("ticks")

    @owner.worker("ticks", concurrency=4)
    async def tick(job: object, ctx: object) -> None:
        await asyncio.sleep(0.01)  # done long before a skewed node ticks the same slot

    for name, skew, drift in (("a", 0.0, 0.0), ("b", 1.3, 0.0), ("c", -0.7, 150.0)):
        sim.node(name, clock_skew_s=skew, clock_drift_ppm=drift).schedule(
            "ticks", {"kind": "minutely"}, name="minutely", **schedule)
    return sim


@pytest.mark.parametrize("schedule", [{"every_s": 60}, {"cron": "* * * * *", "tz": "UTC"}],
                         ids=["interval", "cron"])
def test_three_skewed_nodes_tick_each_slot_once(schedule: dict) -> None:
    result = _two_beats_sim(**schedule).run(until=590.0)
    ev = result.events
    enqueued = ev[(ev["kind"] == "enqueued") & (ev["queue"] == "ticks")]
    ids = list(enqueued["job_id"])
    assert len(ids) == len(set(ids))
    slots = sorted(int(i.rsplit(":", 1)[1]) for i in ids)
    # SIM_EPOCH is a whole minute: the slots are the 10 minutes 0..540 s after it, once each.
    assert slots == [int(SIM_EPOCH) + 60 * k for k in range(10)]
    jobs = result.jobs
    assert set(jobs["state"]) == {"done"} and list(jobs["effects"]) == [1] * 10
    assert result.check()["ok"].all()
