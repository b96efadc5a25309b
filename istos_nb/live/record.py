"""``LiveQueue.record(seconds)``: follow a live queue for a while and return a replayable Trace.

The recording runs on the LiveQueue's own loop thread with a follow stream of its own (a
follow the caller already runs is left alone), so a notebook cell that waits for it keeps its
kernel's loop running, as every LiveQueue call does. Only events the owner publishes while the
recording follows are kept (the ring's older events are not merged: their jobs' arrivals may
lie before the recording, and replay needs arrivals). ``bodies=True`` polls the waiting jobs
once a second and keeps each body seen (its size and decoded data); jobs claimed between two
polls have none.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from istos import codec
from istos.errors import ConfigError, IstosError

from ..data.trace import Trace
from .loop import Stream, keep_following, stop_stream
from .requests import OwnerRequests

__all__ = ["record_on_loop", "check_seconds", "MAX_RECORD_EVENTS"]

MAX_RECORD_EVENTS = 1_000_000
BODY_POLL_S = 1.0


def check_seconds(seconds: Any) -> None:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
            or not 0 < seconds < float("inf"):
        raise ConfigError(f"record: seconds must be a number > 0, got {seconds!r}")


async def record_on_loop(req: OwnerRequests, events_key: str, seconds: float, bodies: bool,
                         on_start: Callable[[], None] | None = None) -> Trace:
    """The recording of ``req``'s queue, whose owner publishes on ``events_key`` (runs on the
    LiveQueue's loop thread); ``on_start()`` once the owner publishes."""
    policy = (await req.stats()).get("policy") or {}
    stream = Stream(MAX_RECORD_EVENTS, 30.0)
    stream.handle = await req.transport.declare_subscriber(events_key, stream.on_batch)
    seen: dict[str, dict[str, Any]] = {}
    poller = asyncio.get_running_loop().create_task(_poll_bodies(req, seen)) if bodies else None
    try:
        reply = await req.ask("follow", ttl_s=30.0)
        stream.ttl_s = float(reply.get("ttl_s") or 30.0)
        stream.renewer = asyncio.get_running_loop().create_task(
            keep_following(stream, lambda: req.ask("follow", ttl_s=30.0)))
        if on_start is not None:
            on_start()
        await asyncio.sleep(seconds)
    finally:
        if poller is not None:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
        await stop_stream(stream)
    events = stream.tail(MAX_RECORD_EVENTS)
    trace = Trace.from_events(events, queue=req.queue, policy=policy, source="follow")
    trace.dropped = stream.counts["dropped"] + stream.counts["bad"]
    trace.bodies = seen
    return trace


async def _poll_bodies(req: OwnerRequests, seen: dict[str, dict[str, Any]]) -> None:
    while True:
        try:
            rows = await req.jobs(["ready", "delayed"], {}, None, 0)
        except IstosError:  # a busy owner misses a poll; the next one tries again
            rows = None
        for job_id, data in ([] if rows is None else zip(rows["job_id"], rows["data"],
                                                          strict=True)):
            if job_id not in seen:
                try:
                    size = len(codec.encode_body(data))
                except IstosError:
                    size = 0
                seen[str(job_id)] = {"body_of": str(job_id), "size": size,
                                     "data": data if not isinstance(data, bytes) else data.hex()}
        await asyncio.sleep(BODY_POLL_S)
