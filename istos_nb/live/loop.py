"""The machinery under :class:`istos_nb.live.attach.LiveQueue`: its background loop and its stream.

:class:`LoopThread` is a private asyncio loop in a daemon thread; :func:`run_bounded` and
:func:`sync_call` are how a synchronous caller (a script, a Jupyter cell) runs a coroutine there
and waits with a bound. :class:`Stream` is the rolling window of a followed event stream, fed
on the loop thread by the engine's follower and read from any thread, with its counters;
:func:`start_stream` starts feeding it and :func:`stop_stream` ends it.

Nothing here knows the RPC protocol: requests are made by ``attach.py`` and handed in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from istos.client.follow import MARKERS, Follower
from istos.client.loopthread import LoopThread as BaseLoopThread
from istos.errors import OwnerUnavailable

from .reenter import can_reenter, wait_running_loop

T = TypeVar("T")


class LoopThread(BaseLoopThread):
    """The engine's loop thread (:class:`istos.client.loopthread.LoopThread`), whose plain
    :meth:`run` keeps a notebook cell's own loop running while it waits."""

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run ``coro`` on the loop and wait; cancel it if the caller stops waiting (timeout,
        Ctrl-C). Called inside a running event loop (a notebook cell), that loop keeps running
        while this waits (see ``_reenter``), so an owner served on it can answer."""
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        caller = caller_loop()
        try:
            if caller is not None and can_reenter(caller):
                return wait_running_loop(caller, fut, timeout_s)
            return fut.result(timeout_s)
        except BaseException:
            fut.cancel()
            raise


# -- synchronous calls onto the loop -----------------------------------------------------------
def run_bounded(loop: LoopThread, coro: Coroutine[Any, Any, T], timeout_s: float, what: str,
                queue: str) -> T:
    """``loop.run(coro, timeout_s)``; running out of time is ``OwnerUnavailable`` for ``queue``."""
    try:
        return loop.run(coro, timeout_s)
    except concurrent.futures.TimeoutError:
        raise OwnerUnavailable(f"queue {queue!r}: {what} did not finish within "
                               f"{timeout_s:g} s") from None


def sync_call(loop: LoopThread, make: Callable[[], Coroutine[Any, Any, T]], timeout_s: float,
              what: str, queue: str) -> T:
    """Run ``make()`` on the loop thread and wait for it, at most ``timeout_s``.

    An ``OwnerUnavailable`` raised while the caller's own event loop is running and could not
    be kept running (not a stock asyncio loop) says why that may be and what to do instead.
    """
    try:
        return run_bounded(loop, make(), timeout_s, what, queue)
    except OwnerUnavailable as exc:
        caller = caller_loop()
        if caller is not None and not can_reenter(caller):
            raise OwnerUnavailable(
                f"{exc}. Note: this call blocked a running {type(caller).__name__}; if the "
                "owner is served on that loop it could not answer: use the `a`-prefixed "
                "twin (`await q.astats()`) or attach from another process") from exc
        raise


async def async_call(loop: LoopThread, make: Callable[[], Coroutine[Any, Any, T]],
                     timeout_s: float, what: str, queue: str) -> T:
    """The awaitable :func:`sync_call`: the caller's loop runs freely meanwhile."""
    try:
        return await loop.arun(make(), timeout_s)
    except asyncio.TimeoutError:
        raise OwnerUnavailable(f"queue {queue!r}: {what} did not finish within "
                               f"{timeout_s:g} s") from None


def caller_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running on the calling thread, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


# -- the followed event stream -----------------------------------------------------------------
def event_key(event: dict[str, Any]) -> tuple[Any, ...]:
    # What identifies one emitted event: the owner stamps each with its own clock, and two
    # events of one job at the same instant always differ in kind.
    return (event.get("t"), event.get("node"), event.get("job_id"), event.get("kind"),
            event.get("attempt"))


class Stream:
    """The followed event stream: a bounded window fed on the loop thread, read from any thread.

    Fed by the engine's follower (:class:`istos.client.follow.Follower`: it renews the follow,
    notices a lost owner, and fetches back from the owner's ring what the live stream missed).
    Counters: ``received`` events the follower delivered, ``duplicates`` of them already
    present from the ring snapshot, ``dropped`` events pushed out of the full window (older
    events no longer shown by ``events()``), ``snapshot`` events taken from the owner's ring
    when following started; the follower's ``batches``, ``bad`` (undecodable batches),
    ``renewals`` and ``renew_errors`` of the follow. ``ttl_s`` is the follow's ttl as last
    granted by the owner. What the owner's sequence numbers say (see
    ``istos.owner.persistence.sequence``): ``epoch`` and ``last_seq`` of the newest event,
    ``missed`` events the follower could not fetch back (no longer in the owner's ring), and
    ``owner_restarts`` (a new epoch appeared); ``owner_up`` is False from a renewal that got no
    answer until one does (``owner_lost`` and ``owner_back`` count those changes).
    """

    def __init__(self, window: int, ttl_s: float) -> None:
        self.lock = threading.Lock()
        self.window: deque[dict[str, Any]] = deque(maxlen=window)
        self.snapshot_keys: set[tuple[Any, ...]] = set()
        self.counts = dict.fromkeys(("received", "duplicates", "dropped", "snapshot", "missed",
                                     "owner_restarts", "owner_lost", "owner_back"), 0)
        self.owner_up = True
        self.ttl_s = ttl_s
        self.follower: Follower | None = None
        self.pump: asyncio.Task[None] | None = None

    def feed(self, item: dict[str, Any]) -> None:
        """One item of the follower (loop thread): an event (with its ``seq``) or a marker."""
        counts = self.counts
        with self.lock:
            kind = item.get("kind")
            if kind in MARKERS:
                self._note_marker(str(kind), item)
                return
            item.pop("seq", None)  # the follower's numbering; the window holds owner events
            counts["received"] += 1
            if self.snapshot_keys and event_key(item) in self.snapshot_keys:
                counts["duplicates"] += 1
                return
            if len(self.window) == self.window.maxlen:
                counts["dropped"] += 1
            self.window.append(item)

    def _note_marker(self, kind: str, item: dict[str, Any]) -> None:
        counts = self.counts
        if kind == "gap":
            counts["missed"] += int(item.get("missed") or 0)
            if item.get("lost_with_owner"):
                counts["owner_restarts"] += 1
        elif kind == "owner_lost" and self.owner_up:
            self.owner_up = False
            counts["owner_lost"] += 1
        elif kind == "owner_back" and not self.owner_up:
            self.owner_up = True
            counts["owner_back"] += 1

    def merge_snapshot(self, events: list[dict[str, Any]]) -> None:
        """Put the ring snapshot (older) before the live events seen so far, de-duplicated.

        The snapshot was taken after the owner started publishing, so it may hold events that
        also arrive live, before or after this merge; their keys stay to filter late copies.
        """
        with self.lock:
            self.snapshot_keys = {event_key(e) for e in events}
            live = [e for e in self.window if event_key(e) not in self.snapshot_keys]
            self.counts["duplicates"] += len(self.window) - len(live)
            self.counts["snapshot"] = len(events)
            merged = [*events, *live]
            self.counts["dropped"] += max(0, len(merged) - (self.window.maxlen or 0))
            self.window = deque(merged, maxlen=self.window.maxlen)

    def resize(self, window: int) -> None:
        with self.lock:
            self.counts["dropped"] += max(0, len(self.window) - window)
            self.window = deque(self.window, maxlen=window)

    def tail(self, limit: int) -> list[dict[str, Any]]:
        with self.lock:
            n = len(self.window)
            return [self.window[i] for i in range(max(0, n - limit), n)] if limit < n \
                else list(self.window)

    def stats(self, following: bool) -> dict[str, Any]:
        f = self.follower
        extra = dict.fromkeys(("batches", "bad", "renewals", "renew_errors"), 0) \
            if f is None else dict(f.counts)
        with self.lock:
            return {"following": following, "window": self.window.maxlen,
                    "held": len(self.window), **self.counts, **extra,
                    "last_error": None if f is None else f.last_error,
                    "epoch": None if f is None else f.epoch,
                    "last_seq": 0 if f is None else f.last, "owner_up": self.owner_up,
                    "ttl_s": self.ttl_s if f is None else f.granted_ttl_s}


async def start_stream(stream: Stream, follower: Follower) -> None:
    """Feed ``stream`` from ``follower`` (a task on this loop) until :func:`stop_stream`; return
    once the owner publishes to it. Raises what the follow's start raised (OwnerUnavailable)."""
    publishing = asyncio.Event()
    follower.on_following = publishing.set
    stream.follower = follower

    async def pump() -> None:
        async for item in follower.items():
            stream.feed(item)

    stream.pump = asyncio.ensure_future(pump())
    waiter = asyncio.ensure_future(publishing.wait())
    try:
        await asyncio.wait({stream.pump, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if stream.pump.done():
        stream.pump.result()  # the start failed: its error


async def stop_stream(stream: Stream) -> None:
    if stream.pump is not None:
        stream.pump.cancel()
        await asyncio.gather(stream.pump, return_exceptions=True)
