"""Recording a queue: follow it for a while and keep what a trace file needs.

One concept at three layers: the recording here; ``ops/record.py`` writes it as a file,
``istos_nb/live/record.py`` builds a Trace of it.

The one recording of ``istos record`` (which writes it as a trace file, :mod:`istos.tracefile`)
and ``istos_nb``'s ``LiveQueue.record`` (which builds a ``Trace`` of it). It follows the owner's
event stream (:class:`~istos.client.follow.Follower`) for ``seconds`` from the moment the owner
publishes to it, and asks the owner for the queue's policy (``stats``). Only events the owner
publishes while the recording follows are kept (the ring's older ones are not: their jobs'
arrivals may lie before the recording, and replay needs arrivals). ``bodies=True`` also polls
the owner's waiting jobs every :data:`BODY_POLL_S` and keeps each body seen (its size and
decoded data); jobs claimed between two polls have none.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import codec, tracefile
from ..errors import ConfigError
from ..transport.base import Transport
from .call import OwnerClient
from .follow import MARKERS, Follower
from .pages import jobs_pages

BODY_POLL_S = 1.0
MAX_EVENTS = 2_000_000  # beyond this a recording stops taking events and says how many it lost


@dataclass
class Recording:
    """A trace file's three parts: its ``header`` (:func:`istos.tracefile.header`), the
    ``events`` (each checked by :func:`istos.tracefile.check_event`) and the ``bodies``."""

    header: dict[str, Any]
    events: list[dict[str, Any]]
    bodies: list[dict[str, Any]]


def check_seconds(seconds: Any) -> float:
    """A recording's length: a finite number > 0 (else ConfigError)."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not 0 < seconds < float("inf"):
        raise ConfigError(f"record: seconds must be a number > 0, got {seconds!r}")
    return float(seconds)


async def record(transport: Transport, client: OwnerClient, seconds: float, *,
                 bodies: bool = False, on_start: Callable[[], None] | None = None) -> Recording:
    """Follow ``client``'s queue for ``seconds`` (``on_start()`` once the owner publishes to
    this recording); raises :class:`~istos.errors.OwnerUnavailable` if no owner answers at
    the start. A malformed event from the wire is counted in the header's ``dropped``."""
    length = check_seconds(seconds)
    clock = client.node.clock
    policy = (await client.call("stats"))["stats"].get("policy") or {}
    events: list[dict[str, Any]] = []
    seen: dict[str, dict[str, Any]] = {}
    dropped = 0
    following = asyncio.Event()

    def started_following() -> None:
        following.set()
        if on_start is not None:
            on_start()

    async def pump() -> None:
        nonlocal dropped
        async for item in Follower(transport, client, started_following).items():
            if item.get("kind") in MARKERS:
                continue
            if len(events) < MAX_EVENTS:
                events.append({k: v for k, v in item.items() if k != "seq"})
            else:
                dropped += 1

    follow = asyncio.ensure_future(pump())
    tasks = [follow, asyncio.ensure_future(following.wait())]
    if bodies:
        tasks.append(asyncio.ensure_future(_poll_bodies(client, seen)))
    try:
        await asyncio.wait(tasks[:2], return_when=asyncio.FIRST_COMPLETED)
        if follow.done():
            follow.result()  # the follow failed at its start: OwnerUnavailable
        started = clock.now()
        await clock.sleep(length)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    good = []
    for n, event in enumerate(events):
        try:
            good.append(tracefile.check_event(event, f"event {n}"))
        except tracefile.TraceFormatError:
            dropped += 1  # a malformed event from the wire is counted, never kept
    head = tracefile.header(client.queue, policy, good, started=started, ended=clock.now(),
                            source="follow", dropped=dropped)
    return Recording(head, good, list(seen.values()))


async def _poll_bodies(client: OwnerClient, seen: dict[str, dict[str, Any]]) -> None:
    while True:
        for state in ("ready", "delayed"):
            try:
                rows, _, _ = await jobs_pages(client, state, {}, None, 0)
            except Exception:  # noqa: BLE001 - a busy owner misses a poll; the next one tries
                continue
            for row in rows:
                job_id, raw = str(row.get("job_id")), row.get("body")
                if job_id not in seen and isinstance(raw, bytes):
                    seen[job_id] = {"body_of": job_id, "size": len(raw),
                                    "data": _json_safe(_decoded(raw))}
        await client.node.clock.sleep(BODY_POLL_S)


def _decoded(raw: bytes) -> Any:
    try:
        return codec.decode_body(raw)
    except Exception:  # noqa: BLE001 - msgpack raises several unrelated types
        return raw


def _json_safe(value: Any) -> Any:
    return value.hex() if isinstance(value, bytes) else value
