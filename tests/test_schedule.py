"""Interval and cron schedules on the in-process mesh, timed on injected clocks."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest
from helpers import count, wait_events

from istos import ConfigError, CronError, Istos, JobEvent, MemoryStorage, codec
from istos.features import schedule as schedmod
from istos.transport.local import LocalMesh

pytestmark = pytest.mark.fast  # `make check`: no process, server or session


@pytest.fixture
def mesh() -> LocalMesh:
    return LocalMesh()


def app_on(mesh: LocalMesh, name: str, **kw) -> Istos:
    return Istos(transport=mesh.transport(name), **kw)


class ManualClock:
    """A Clock that moves only when the test sets it; sleepers wake when their time comes."""

    def __init__(self, t: float) -> None:
        self.t = t
        self._changed = asyncio.Event()
        self._settled = 0  # sleepers waiting for the clock's next move (reset by each move)
        self._news = asyncio.Event()  # set when a sleeper settles

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def to_loop_seconds(self, seconds: float) -> float:
        return seconds

    async def sleep(self, seconds: float) -> None:
        target = self.t + seconds
        while self.t < target:
            changed = self._changed
            self._settled += 1
            self._news.set()
            try:
                await changed.wait()
            finally:
                if changed is self._changed:  # cancelled before the clock moved
                    self._settled -= 1

    def set(self, t: float) -> None:
        self.t = t
        self._settled = 0  # every sleeper must look at the new time before it counts again
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def asleep(self, sleepers: int = 1) -> None:
        """Wait until ``sleepers`` tasks sleep on this clock since its last move (each beat
        has read the new time and chosen its next slot), bounded."""

        async def until() -> None:
            while self._settled < sleepers:
                self._news.clear()
                await self._news.wait()

        await asyncio.wait_for(until(), 5.0)


def enqueued_ids(app: Istos, queue: str) -> list[str]:
    return [e.job_id for e in app.events.recent() if e.kind == "enqueued" and e.queue == queue]


# -- declaration errors --

@pytest.mark.parametrize("kwargs", [{}, {"every_s": 5, "cron": "* * * * *"}])
def test_exactly_one_of_every_s_and_cron(kwargs):
    app = Istos(transport=LocalMesh().transport("x"))
    with pytest.raises(ConfigError, match="every_s= or cron="):
        app.schedule("q", {}, **kwargs)


def test_invalid_declarations_raise_at_declaration_naming_the_problem():
    app = Istos(transport=LocalMesh().transport("x"))
    with pytest.raises(CronError, match="'hour'"):
        app.schedule("q", {}, cron="0 25 * * *")
    with pytest.raises(CronError, match="'minute'"):
        app.schedule("q", {}, cron="*/0 * * * *")
    with pytest.raises(ConfigError, match="every_s"):
        app.schedule("q", {}, every_s=0)
    with pytest.raises(ConfigError, match="initial_delay_s"):
        app.schedule("q", {}, every_s=1, initial_delay_s=-1)
    with pytest.raises(ConfigError, match="tz"):
        app.schedule("q", {}, cron="0 2 * * *", tz="Mars/Olympus")
    with pytest.raises(ValueError, match="cannot be encoded"):
        app.schedule("q", object(), every_s=1)
    assert app.schedule("q", {}, cron="0  2 * * *") == "q@0 2 * * *"
    with pytest.raises(ConfigError, match="already declared"):
        app.schedule("q", {"other": 1}, cron="0 2 * * *")
    assert app.schedule("q", {"other": 1}, cron="0 2 * * *", name="nightly") == "nightly"


def test_default_zone_is_the_nodes_iana_zone_or_utc(monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    assert schedmod.local_zone() == ZoneInfo("Asia/Tokyo")
    monkeypatch.setenv("TZ", ":Europe/Paris")
    assert schedmod.local_zone() == ZoneInfo("Europe/Paris")
    monkeypatch.setenv("TZ", "Not/AZone")
    monkeypatch.setattr(schedmod.os.path, "realpath", lambda p: "/nowhere")
    assert schedmod.local_zone() in (ZoneInfo("UTC"), timezone.utc)


# -- intervals --

async def test_interval_ticks_on_the_grid(mesh):
    """Ticks land on the ``every_s`` grid, one per slot, never early. The beat runs on a clock
    the test moves slot by slot: on the loop's clock a loaded machine made it miss a 50 ms slot
    (missed ticks are not replayed), which is a feature, not what this test is about."""
    clock = ManualClock(1000.0)
    beat, owner = app_on(mesh, "beat", clock=clock), app_on(mesh, "owner")
    owner.queue("beat")
    beat.schedule("beat", {"kind": "tick"}, every_s=0.05, name="fast")
    seen_at: list[float] = []  # the beat's clock when each tick reached the owner
    owner.events.subscribe(lambda e: seen_at.append(clock.now()) if e.kind == "enqueued" else None)
    async with owner.serving(), beat.serving():
        for k in range(1, 8):  # bounded: four ticks take at most one slot more than four
            if len(seen_at) >= 4:
                break
            await clock.asleep()
            clock.set(1000.0 + 0.05 * k + 1e-7)  # just past the slot: float grid points
            await wait_events(owner, lambda ev, n=len(seen_at): count(ev, "enqueued") > n,
                              timeout_s=5.0)
        events = owner.events.recent()
        job = owner.owners["beat"].state.jobs[enqueued_ids(owner, "beat")[0]]
    ticks = [e for e in events if e.kind == "enqueued"][:4]
    slots = [float(e.job_id.rsplit(":", 1)[1]) for e in ticks]
    assert all(e.job_id.startswith("sched:fast:") for e in ticks)
    gaps = [b - a for a, b in zip(slots, slots[1:])]
    assert gaps == pytest.approx([0.05, 0.05, 0.05], abs=2e-6)  # ids carry 6 decimals
    assert all(at >= slot for at, slot in zip(seen_at, slots))  # never early
    assert job.body == b"\x81\xa4kind\xa4tick"


async def test_initial_delay_is_respected_and_ticks_are_deterministic_ids(mesh):
    clock = ManualClock(1000.0)
    beat, owner = app_on(mesh, "beat", clock=clock), app_on(mesh, "owner")
    owner.queue("q")
    beat.schedule("q", "x", every_s=10, initial_delay_s=30, name="late")
    clock_at_enqueue: list[float] = []
    owner.events.subscribe(
        lambda e: clock_at_enqueue.append(clock.now()) if e.kind == "enqueued" else None)
    async with owner.serving(), beat.serving():
        await clock.asleep()
        clock.set(1029.0)  # wakes the beat's nap, which must go back to sleep
        await clock.asleep()
        clock.set(1030.0)
        await wait_events(owner, lambda ev: count(ev, "enqueued") == 1)
        await clock.asleep()
        clock.set(1040.0)
        await wait_events(owner, lambda ev: count(ev, "enqueued") == 2)
    assert enqueued_ids(owner, "q") == ["sched:late:1030", "sched:late:1040"]
    assert clock_at_enqueue == [1030.0, 1040.0]  # not at 1029: the delay held


async def test_missed_ticks_are_not_replayed(mesh):
    clock = ManualClock(1000.0)
    beat, owner = app_on(mesh, "beat", clock=clock), app_on(mesh, "owner")
    owner.queue("q")
    beat.schedule("q", {}, every_s=10, name="s")
    async with owner.serving(), beat.serving():
        await wait_events(owner, lambda ev: count(ev, "enqueued") == 1)
        await clock.asleep()
        clock.set(1010.0)
        await wait_events(owner, lambda ev: count(ev, "enqueued") == 2)
        await clock.asleep()
        clock.set(1110.0)  # the node was paused for ten periods
        await wait_events(owner, lambda ev: count(ev, "enqueued") == 3)
        await clock.asleep()
        assert len(enqueued_ids(owner, "q")) == 3  # no catch-up burst
        clock.set(1120.0)
        await wait_events(owner, lambda ev: count(ev, "enqueued") == 4)
        await clock.asleep()
    assert enqueued_ids(owner, "q") == ["sched:s:1000", "sched:s:1010", "sched:s:1020",
                                        "sched:s:1120"]


async def test_clock_stepped_back_never_fires_early_or_twice(mesh):
    """NTP steps the beat's clock back 2.5 periods right after a tick: no slot fires again,
    none fires before its time, and the next slots come on the grid. On a clock the test moves
    (a fast real clock let a loaded machine oversleep slots, which hid what this proves)."""
    clock = ManualClock(5000.0)
    beat, owner = app_on(mesh, "beat", clock=clock), app_on(mesh, "owner")
    owner.queue("q")
    beat.schedule("q", {}, every_s=10, name="s")
    seen: list[tuple[float, float]] = []  # (slot, beat clock at enqueue)

    def on_event(event: JobEvent) -> None:
        if event.kind == "enqueued":
            seen.append((float(event.job_id.rsplit(":", 1)[1]), clock.now()))

    owner.events.subscribe(on_event)
    async with owner.serving(), beat.serving():
        await wait_events(owner, lambda ev: count(ev, "enqueued") == 1)
        await clock.asleep()
        clock.set(4975.0)  # NTP steps the clock back 2.5 periods
        for t in (4980.0, 4990.0, 5000.0, 5009.0):  # slots again, or before the next one
            await clock.asleep()
            clock.set(t)
        await clock.asleep()
        assert len(seen) == 1
        for t, n in ((5010.0, 2), (5020.0, 3)):
            clock.set(t)
            await wait_events(owner, lambda ev, n=n: count(ev, "enqueued") == n)
            await clock.asleep()
    assert seen == [(5000.0, 5000.0), (5010.0, 5010.0), (5020.0, 5020.0)]
    assert count(owner.events.recent(), "duplicate_enqueue") == 0


async def test_failed_enqueue_is_logged_and_the_schedule_continues(mesh, caplog):
    clock = ManualClock(1000.0)
    beat = app_on(mesh, "beat", clock=clock, request_timeout_s=0.05)
    owner = app_on(mesh, "owner")
    owner.queue("q")
    beat.schedule("q", {}, every_s=10, name="s")
    with caplog.at_level(logging.WARNING, logger="istos.schedule"):
        async with beat.serving():
            # The 1000 tick finds no owner: its request retries on the beat's clock until the
            # request timeout has passed on that clock, so move it past the timeout until the
            # tick is given up (logged), bounded.
            for _ in range(200):
                if any("slot 1000" in r.getMessage() for r in caplog.records):
                    break
                await clock.asleep()
                clock.set(clock.t + 0.01)
            async with owner.serving():
                clock.set(1010.0)
                await wait_events(owner, lambda ev: count(ev, "enqueued") == 1)
    assert "sched:s:1010" in enqueued_ids(owner, "q")
    assert any("slot 1000" in r.getMessage() for r in caplog.records)


# -- cron --

async def test_cron_ticks_land_on_the_slots_of_the_clock_and_zone(mesh):
    """Each cron slot fires when the beat's clock reaches it, not a second before, in its zone.
    The clock moves only when the test says (a fast real clock let a loaded machine wake a beat
    a period late)."""
    utc = datetime(2024, 3, 1, 10, 15, tzinfo=timezone.utc).timestamp()
    clock = ManualClock(utc - 450.0)  # 10:07:30 UTC
    beat, owner = app_on(mesh, "beat", clock=clock), app_on(mesh, "owner")
    owner.queue("reports")
    beat.schedule("reports", {"kind": "q"}, cron="*/15 * * * *", tz="UTC", name="quarter")
    beat.schedule("reports", {"kind": "h"}, cron="0 * * * *", tz="Asia/Kolkata", name="ist")
    at_enqueue: dict[str, float] = {}
    owner.events.subscribe(
        lambda e: at_enqueue.setdefault(e.job_id, clock.now()) if e.kind == "enqueued" else None)
    # 16:00 in Kolkata (UTC+05:30) is 10:30 UTC, the quarter's second slot
    ist = datetime(2024, 3, 1, 16, 0, tzinfo=ZoneInfo("Asia/Kolkata")).timestamp()
    assert ist == utc + 900
    expected = {utc: 1, utc + 900: 3, utc + 1800: 4}  # slot: enqueued once it has fired
    async with owner.serving(), beat.serving():
        fired = 0
        for slot, total in expected.items():
            await clock.asleep(2)
            clock.set(slot - 1.0)  # a second early: both beats read it and sleep on
            await clock.asleep(2)
            assert count(owner.events.recent(), "enqueued") == fired
            clock.set(slot)
            await wait_events(owner, lambda ev, n=total: count(ev, "enqueued") == n)
            fired = total
    ids = enqueued_ids(owner, "reports")
    assert [i for i in ids if i.startswith("sched:quarter:")] == [
        f"sched:quarter:{int(utc + k * 900)}" for k in range(3)]
    assert [i for i in ids if i.startswith("sched:ist:")] == [f"sched:ist:{int(ist)}"]
    # each fired at its slot's instant: not early, not late
    assert at_enqueue == {job_id: float(job_id.rsplit(":", 1)[1]) for job_id in ids}


async def test_cron_initial_delay_comes_before_the_first_slot(mesh):
    first = datetime(2024, 3, 1, 10, 30, tzinfo=timezone.utc).timestamp()
    clock = ManualClock(first - 1350.0)  # 10:07:30 UTC
    beat, owner = app_on(mesh, "beat", clock=clock), app_on(mesh, "owner")
    owner.queue("reports")
    # a 10-minute delay skips the 10:15 slot: the first is 10:30
    beat.schedule("reports", {}, cron="*/15 * * * *", tz="UTC", initial_delay_s=600, name="d")
    async with owner.serving(), beat.serving():
        for t in (first - 900.0, first - 750.0 - 1.0, first - 750.0, first - 1.0):
            await clock.asleep()  # 10:15 passes in the delay, then the beat waits for 10:30
            clock.set(t)
        await clock.asleep()
        assert enqueued_ids(owner, "reports") == []
        clock.set(first)
        await wait_events(owner, lambda ev: count(ev, "enqueued") == 1)
    assert enqueued_ids(owner, "reports") == [f"sched:d:{int(first)}"]


# -- HA gating --

def ha_replica(mesh: LocalMesh, name: str, storage: MemoryStorage) -> Istos:
    app = app_on(mesh, name, storage=storage)
    app.queue("beat", ha=True)
    app.schedule("beat", {"from": name}, every_s=0.02, name="ha")
    return app


def senders(app: Istos) -> set[str]:
    """Which replicas' ticks the queue holds (no worker consumes them)."""
    return {codec.decode_body(r.body)["from"] for r in app.owners["beat"].state.jobs.values()}


async def test_on_an_ha_queue_only_the_leader_ticks(mesh):
    storage = MemoryStorage(durable=True, shared=True)
    first, second = ha_replica(mesh, "first", storage), ha_replica(mesh, "second", storage)
    await first.start()
    try:
        await second.start()
        try:
            # the replica that started first leads; the standby's beat stays quiet
            await wait_events(first, lambda ev: count(ev, "enqueued") >= 5, timeout_s=3.0)
            assert first.is_active_owner("beat") and not second.is_active_owner("beat")
            assert "beat" not in second.owners
            assert senders(first) == {"first"}
        finally:
            await first.stop()  # fail over: the standby takes the queue, and the beat
            await wait_events(second, lambda ev: count(ev, "enqueued") >= 3, timeout_s=3.0)
            assert senders(second) == {"first", "second"}
    finally:
        await second.stop()


async def test_ha_gate_follows_is_active_owner(mesh, monkeypatch):
    replica = app_on(mesh, "replica", storage=MemoryStorage(durable=True, shared=True))
    replica.queue("beat", ha=True)
    replica.schedule("beat", {}, every_s=0.02, name="ha")
    leading = False
    asked = asyncio.Event()
    calls: list[str] = []

    def is_active_owner(queue: str) -> bool:
        calls.append(queue)
        if len(calls) >= 3:
            asked.set()
        return leading

    monkeypatch.setattr(replica, "is_active_owner", is_active_owner)
    async with replica.serving():
        # the lone replica wins its election and serves the queue here...
        await wait_events(replica, lambda ev: count(ev, "owner_up") == 1)
        calls.clear()
        asked.clear()
        await asyncio.wait_for(asked.wait(), 3.0)
        assert enqueued_ids(replica, "beat") == []  # ...yet its beat, told no, did not tick
        assert set(calls) == {"beat"}
        leading = True
        await wait_events(replica, lambda ev: count(ev, "enqueued") >= 1, timeout_s=3.0)
    assert enqueued_ids(replica, "beat")[0].startswith("sched:ha:")


async def test_schedule_declared_while_serving_starts_at_once(mesh):
    """The first slot is the first grid point (a multiple of every_s) at or after the beat's
    "now" when declared: not +every_s later, and on the epoch-anchored grid. On a clock the
    test moves (a wall-clock bound on the tick's arrival flipped under load)."""
    clock = ManualClock(1000.2)
    app = app_on(mesh, "solo", clock=clock)
    app.queue("beat")
    async with app.serving():
        app.schedule("beat", {}, every_s=0.5, name="late")
        await clock.asleep()
        assert enqueued_ids(app, "beat") == []
        clock.set(1000.5)
        events = await wait_events(app, lambda ev: count(ev, "enqueued") == 1)
    (tick,) = [e for e in events if e.kind == "enqueued"]
    assert tick.job_id == "sched:late:1000.500000"
    assert tick.t == 1000.5  # at the slot, not a period later
