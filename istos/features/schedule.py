"""Interval and cron schedules: the "beat" that enqueues a job on a timetable, once per slot.

``app.schedule(queue, data, every_s=...)`` or ``app.schedule(queue, data, cron=...)`` declares a
schedule; it ticks on the node that declares it, while that app serves (one task per schedule,
started after the queues and workers, cancelled before them). Everything is timed on the
declaring node's Clock, never the system's, so the simulator's skewed and drifting clocks apply.

Slots are the same on every node that declares the same schedule:

* **Interval**: the grid ``offset_s + k * every_s`` seconds after the Unix epoch (``offset_s``
  defaults to 0, so ``every_s=3600`` ticks on the hour). The first slot is the first grid point
  at or after the clock's ``now()`` plus ``initial_delay_s`` when the app starts serving.
* **Cron**: ``initial_delay_s`` is waited first; then each slot is
  :func:`istos.core.cron.next_fire` of the expression after the clock's current time, matched on
  the wall clock of ``tz`` (Debian cron's DST rules, see :mod:`istos.core.cron`). ``tz``
  defaults to the node's local IANA zone (from ``$TZ`` or ``/etc/localtime``); when that cannot
  be named, UTC. Pass ``tz`` to be explicit (nodes in different zones would otherwise compute
  different slots), and a real zone name rather than a fixed offset, so DST follows the rules.

Waiting: the beat sleeps towards the slot in naps of at most ``MAX_NAP_S`` and re-reads the clock
after each, so a clock stepped forward is noticed within a nap and a clock stepped back (or one
that drifts) never fires a slot early: until ``now() >= slot`` it sleeps again.

Missed ticks are not replayed. A node that was paused, down or simply woke late fires once for
the overdue slot it was waiting for, then moves to the first slot strictly after ``now()``;
a clock jumping ahead by ten periods yields one tick, not a burst of ten.

One tick per slot, however many nodes declare the schedule: each tick sends the slot's job id
``f"sched:{name}:{slot}"`` (``slot``: the slot's timestamp in whole seconds, with six decimals
for intervals shorter than a second) to the queue's owner with the ``enqueue_slot`` op. The
owner enqueues it like any job (a job it still holds is not added twice) and remembers the id in
a bounded :class:`~istos.core.slots.RecentSlots` for ``max(2 periods, 60 s)``, refusing the
same slot again in that time even after its job finished. So declare a schedule on every
replica, under the same name, and it runs once per slot (nodes whose clocks differ by more than
that hold could still tick a slot twice). With durable storage the owner also marks each
accepted slot there (:mod:`~istos.owner.persistence.slot_marks`), so a restarted or failed-over
owner still refuses it; an in-memory owner's restart forgets the finished slots. A failed enqueue
(for example :class:`OwnerUnavailable`) is logged and the schedule carries on with its next slot;
another node declaring the schedule may still enqueue that slot.

High availability: when the schedule's queue is declared on this app with ``ha=True``, a slot is
enqueued only while ``app.is_active_owner(queue)`` holds, so only the elected leader ticks and
standbys stay quiet; slots that pass while this node does not lead are skipped.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..clock import Clock
from ..core import cron as cronlib
from ..core.config import check_queue_name
from ..core.slots import RecentSlots, hold_s
from ..errors import ConfigError, ProtocolError
from ..owner.extension import Hooks, OwnerExtension
from ..owner.persistence.slot_marks import SlotMarks

if TYPE_CHECKING:
    from ..client import OwnerClient
    from ..core.config import QueueConfig
    from ..node import Node
    from ..owner.handle import OwnerHandle

log = logging.getLogger("istos.schedule")

MAX_NAP_S = 60.0
"""Longest single sleep (node clock) before the beat re-reads the clock."""


@dataclass(frozen=True)
class Schedule:
    """One declared schedule (exactly one of ``every_s`` and ``cron`` is set)."""

    name: str
    queue: str
    data: Any
    every_s: float | None
    cron: cronlib.CronSpec | None
    tz: tzinfo
    initial_delay_s: float
    offset_s: float = 0.0  # interval grids: offset_s + k * every_s after the epoch

    def job_id(self, slot: float) -> str:
        """The deterministic id of this schedule's job for ``slot`` (a timestamp)."""
        if self.every_s is not None and self.every_s < 1:
            return f"sched:{self.name}:{slot:.6f}"
        return f"sched:{self.name}:{int(slot)}"

    def first_slot(self, now: float) -> float:
        """The first grid slot at or after ``now + initial_delay_s`` (interval schedules)."""
        start = now + self.initial_delay_s
        slot = self.next_slot(start)
        previous = self._grid(self._index(start))
        return previous if previous == start else slot

    def next_slot(self, after: float) -> float:
        """The first slot strictly after ``after``."""
        if self.cron is not None:
            instant = datetime.fromtimestamp(after, self.tz)
            return cronlib.next_fire(self.cron, instant, self.tz).timestamp()
        k = self._index(after) + 1
        while self._grid(k) <= after:  # float rounding can land on `after` itself
            k += 1
        return self._grid(k)

    def period_after(self, slot: float) -> float:
        """The time from ``slot`` to the next slot: how long the owner must remember it."""
        return self.every_s if self.every_s is not None else self.next_slot(slot) - slot

    # Every node computes a slot as offset + k * every from the same integer k, so the float,
    # and therefore the job id, is bit-identical across nodes.
    def _index(self, t: float) -> int:
        return math.floor((t - self.offset_s) / (self.every_s or 1.0))

    def _grid(self, k: int) -> float:
        return self.offset_s + k * (self.every_s or 1.0)


class Schedules:
    """``schedule()`` of one app (``app.schedules``) and the owner side of its slots.

    Reads the app's declared ``queues`` (an HA queue's slots fire only where it is led:
    ``is_active_owner``), enqueues through its per-queue ``client``, and runs its :class:`Beat`
    as an app plugin (``add_plugin``), registered with the first schedule declared.
    """

    def __init__(self, node: Node, queues: Mapping[str, QueueConfig], *,
                 client: Callable[[str], OwnerClient], is_active_owner: Callable[[str], bool],
                 add_plugin: Callable[[Any], None], serving: Callable[[], bool]) -> None:
        self.node = node
        self.queues = queues
        self.client = client
        self.is_active_owner = is_active_owner
        self._add_plugin = add_plugin
        self._serving = serving
        self._beat: Beat | None = None

    def schedule(self, queue: str, data: Any, *, every_s: float | None = None,
                 cron: str | None = None, tz: str | None = None,
                 initial_delay_s: float = 0.0, name: str | None = None,
                 offset_s: float | None = None) -> str:
        """Enqueue ``data`` on ``queue`` every ``every_s`` seconds or on a ``cron`` expression.

        Interval slots lie on the grid ``offset_s + k * every_s`` after the Unix epoch, so every
        node declaring the same schedule computes the same slots. Returns the schedule's name
        (default: ``f"{queue}@{every_s}s"``, plus ``f"+{offset_s}"`` for a nonzero offset, or
        ``f"{queue}@{cron}"``); names are unique per app and stable, since job ids derive
        from them: give a schedule the same name on every node that declares it. Raises
        :class:`ConfigError` (naming the option) unless exactly one of ``every_s`` and ``cron``
        is given, for ``every_s <= 0``, ``offset_s`` with ``cron`` or outside
        ``[0, every_s)``, a negative ``initial_delay_s``, an unknown ``tz`` or a duplicate
        name; :class:`CronError` naming the field for an invalid cron expression;
        :class:`InvalidJob` for data msgpack cannot encode. All at declaration.
        """
        check_queue_name(queue)
        if (every_s is None) == (cron is None):
            got = "both" if every_s is not None else "neither"
            raise ConfigError(f"schedule({queue!r}) needs exactly one of every_s= or cron=, "
                              f"got {got}")
        spec, offset = None, 0.0
        if cron is not None:
            if offset_s is not None:
                raise ConfigError("offset_s applies to every_s= schedules; a cron expression "
                                  "already fixes its slots")
            spec = cronlib.parse(cron)  # CronError names the field
        else:
            every_s = _finite("every_s", every_s, allow_zero=False)
            offset = _finite("offset_s", 0.0 if offset_s is None else offset_s, allow_zero=True)
            if offset >= every_s:
                raise ConfigError(f"offset_s must be below every_s ({every_s:g}), got {offset:g}")
        delay = _finite("initial_delay_s", initial_delay_s, allow_zero=True)
        zone = _zone(tz)
        self.node.payload.encode_body(data, queue=queue)  # (encoded again on each tick)
        if name is None:
            name = f"{queue}@{' '.join(cron.split())}" if cron is not None \
                else f"{queue}@{every_s:g}s" + (f"+{offset:g}" if offset else "")
        elif not isinstance(name, str) or not name:
            raise ConfigError(f"schedule name must be a non-empty string, got {name!r}")
        beat = self.beat()
        if name in beat.schedules:
            raise ConfigError(f"a schedule named {name!r} is already declared on this app; "
                              "pass a distinct name=")
        beat.add(Schedule(name, queue, data, every_s, spec, zone, delay, offset))
        return name

    def owner_extension(self, owner: OwnerHandle) -> OwnerExtension:
        """Every owner answers ``enqueue_slot``, so a schedule declared on any node reaches it."""
        return Hooks(name="schedules", ops={"enqueue_slot": SlotEnqueuer(owner).op})

    def beat(self) -> Beat:
        """The beat running this app's schedules (made, and added as a plugin, on first use)."""
        beat = self._beat
        if beat is None:
            beat = self._beat = Beat(self)
            self._add_plugin(beat)
            if self._serving():
                beat.running = True  # declared on a serving app: its schedules start at once
        return beat


class Beat:
    """The plugin that runs an app's schedules: one task per schedule while the app serves."""

    def __init__(self, app: Schedules) -> None:
        self.app = app
        self.schedules: dict[str, Schedule] = {}
        self.running = False
        self._generation = 0  # bumped by stop(): a beat whose cancel was lost still ends
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def add(self, sched: Schedule) -> None:
        self.schedules[sched.name] = sched
        if self.running:
            self._spawn(sched)

    async def start(self, app: Any) -> None:
        self.running = True
        for sched in self.schedules.values():
            self._spawn(sched)

    async def stop(self, app: Any) -> None:
        self.running = False
        self._generation += 1
        tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, sched: Schedule) -> None:
        generation = self._generation
        task = asyncio.get_running_loop().create_task(run_schedule(
            sched, self.app.node.clock, self._tick,
            lambda: self.running and self._generation == generation))
        self._tasks[sched.name] = task
        task.add_done_callback(functools.partial(_report_death, sched.name))

    async def _tick(self, sched: Schedule, slot: float) -> None:
        app = self.app
        config = app.queues.get(sched.queue)
        if config is not None and config.ha and not app.is_active_owner(sched.queue):
            log.debug("schedule %s: skipped slot %s (not the active owner of %s)",
                      sched.name, slot, sched.queue)
            return
        try:
            # The app's payload codecs, as its producers use: a fresh nonce per tick.
            body = app.node.payload.encode_body(sched.data, queue=sched.queue)
            reply = await app.client(sched.queue).call(
                "enqueue_slot", None, body=body, job_id=sched.job_id(slot),
                period_s=sched.period_after(slot))
            if not reply.get("created"):
                log.debug("schedule %s: slot %s was already enqueued", sched.name, slot)
        except Exception as exc:  # a beat outlives any one failed tick
            log.warning("schedule %s: enqueue on %s for slot %s failed: %s",
                        sched.name, sched.queue, slot, exc)


async def run_schedule(sched: Schedule, clock: Clock, tick: Callable[[Schedule, float], Any],
                       alive: Callable[[], bool] = lambda: True) -> None:
    """Tick ``sched`` on ``clock`` with the module's missed-tick policy until cancelled or
    ``alive()`` turns false.

    ``tick(sched, slot)`` is awaited once per slot; while it runs, no other slot fires.
    ``alive`` is checked after every wait because a cancellation can be lost: on Python < 3.12
    ``asyncio.wait_for`` returns the inner result when it completes in the same loop turn as
    the cancel, so a stopped beat would otherwise sleep on towards its next slot.
    """
    if sched.cron is None:
        target = sched.first_slot(clock.now())
    else:
        await sleep_until(clock, clock.now() + sched.initial_delay_s)
        target = sched.next_slot(clock.now())
    while alive():
        await sleep_until(clock, target)
        if not alive():
            return
        await tick(sched, target)
        # Strictly after both: never the slot just fired again (a clock stepped back), and
        # none of the slots a late wake-up overslept (no burst of catch-up ticks).
        target = sched.next_slot(max(clock.now(), target))


class SlotEnqueuer:
    """The owner side of ``enqueue_slot``: enqueue a schedule's slot at most once.

    Request: ``body`` (bytes), ``job_id`` (the slot's id), ``period_s`` (time to the schedule's
    next slot). Reply: ``job_id``, ``created`` (False when the queue holds the id or the slot
    is remembered). The id is remembered only after the enqueue succeeded (write, then apply),
    so a storage outage leaves the slot free for a retry from another node.
    """

    def __init__(self, owner: OwnerHandle) -> None:
        self.owner = owner
        self.recent = RecentSlots()
        # Durable storage also keeps the slots across an owner restart or failover.
        self.marks = SlotMarks(owner.storage, owner.name) if owner.durable else None

    async def op(self, msg: dict[str, Any]) -> dict[str, Any]:
        body, job_id, period = msg.get("body"), msg.get("job_id"), msg.get("period_s")
        if not isinstance(body, bytes):
            raise ProtocolError("enqueue_slot body must be bytes")
        if not isinstance(job_id, str) or not job_id:
            raise ProtocolError(f"enqueue_slot job_id must be a non-empty string, got {job_id!r}")
        if isinstance(period, bool) or not isinstance(period, (int, float)) \
                or not math.isfinite(period) or period <= 0:
            raise ProtocolError(f"enqueue_slot period_s must be a finite number > 0, "
                                f"got {period!r}")
        clock, period = self.owner.node.clock, float(period)
        if self.recent.seen(job_id, clock.now()):
            return {"job_id": job_id, "created": False}
        if self.marks is not None and await self.marks.held(job_id, clock.now()):
            self.recent.remember(job_id, clock.now(), period)  # a slot an earlier owner took
            return {"job_id": job_id, "created": False}
        created = await self.owner.enqueue(body, job_id=job_id)
        now = clock.now()
        self.recent.remember(job_id, now, period)
        if self.marks is not None:  # after the job is stored: a mark never lacks its job
            await self.marks.mark(job_id, now + hold_s(period), now)
        return {"job_id": job_id, "created": created}


def _report_death(name: str, task: asyncio.Task[None]) -> None:
    # A beat only ends by cancellation or stop; anything else must not vanish silently.
    if not task.cancelled() and task.exception() is not None:
        log.error("schedule %s stopped ticking", name, exc_info=task.exception())


async def sleep_until(clock: Clock, target: float) -> None:
    """Return once ``clock.now() >= target``, re-reading the clock at least every nap."""
    while True:
        remaining = target - clock.now()
        if remaining <= 0:
            return
        await clock.sleep(min(remaining, MAX_NAP_S))


def _finite(option: str, value: object, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{option} must be a finite number, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{option} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


def _zone(tz: str | None) -> tzinfo:
    if tz is None:
        return local_zone()
    if not isinstance(tz, str):
        raise ConfigError(f"tz must be an IANA zone name such as 'Europe/Paris', got {tz!r}")
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(f"tz {tz!r} is not a known IANA time zone") from exc


def local_zone() -> tzinfo:
    """This node's IANA zone from ``$TZ`` or ``/etc/localtime``; UTC when it cannot be named.

    ``datetime.now().astimezone()`` only yields a fixed offset, which would get DST wrong.
    """
    candidates = []
    env = os.environ.get("TZ", "").lstrip(":")
    if env:
        candidates.append(env.split("zoneinfo/", 1)[-1])
    try:
        link = os.path.realpath("/etc/localtime")
    except OSError:
        link = ""
    if "zoneinfo/" in link:
        candidates.append(link.split("zoneinfo/", 1)[1])
    for key in candidates:
        try:
            return ZoneInfo(key)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            continue
    try:
        return ZoneInfo("UTC")
    except ZoneInfoNotFoundError:
        return timezone.utc
