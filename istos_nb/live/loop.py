"""The machinery under :class:`istos_nb.live.attach.LiveQueue`: its background loop and its stream.

:class:`LoopThread` is a private asyncio loop in a daemon thread; :func:`run_bounded` and
:func:`sync_call` are how a synchronous caller (a script, a Jupyter cell) runs a coroutine there
and waits with a bound. :class:`Stream` is the rolling window of a followed event stream, fed
on the loop thread and read from any thread, with its counters; :func:`keep_following` renews
the follow and :func:`stop_stream` ends it.

Nothing here knows the RPC protocol: requests are made by ``attach.py`` and handed in.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from istos import codec
from istos.client.loopthread import LoopThread as BaseLoopThread
from istos.errors import IstosError, OwnerUnavailable, ProtocolError

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

    Counters: ``received`` events delivered by the live stream, ``duplicates`` of them already
    present from the ring snapshot, ``dropped`` events pushed out of the full window (older
    events no longer shown by ``events()``), ``snapshot`` events taken from the owner's ring when
    following started, ``bad`` undecodable batches, ``renewals``/``renew_errors`` of the follow.
    ``ttl_s`` is the follow's ttl as last granted by the owner (``ttl_s`` until it answers).
    What the owner's sequence numbers say (see ``istos.owner.sequence``): ``epoch`` and
    ``last_seq`` of the newest event, ``missed`` events the live stream skipped within an
    epoch (dropped batches: exactly how many), ``owner_restarts`` (a new epoch appeared), and
    ``owner_up`` (False from a renewal that got no answer until one does; ``owner_lost`` and
    ``owner_back`` count those changes).
    """

    def __init__(self, window: int, ttl_s: float) -> None:
        self.lock = threading.Lock()
        self.window: deque[dict[str, Any]] = deque(maxlen=window)
        self.snapshot_keys: set[tuple[Any, ...]] = set()
        self.counts = dict.fromkeys(("received", "duplicates", "dropped", "snapshot", "batches",
                                     "bad", "renewals", "renew_errors", "missed",
                                     "owner_restarts", "owner_lost", "owner_back"), 0)
        self.epoch: str | None = None
        self.last_seq = 0
        self.owner_up = True
        self.last_error: str | None = None
        self.ttl_s = ttl_s
        self.handle: Any = None
        self.renewer: asyncio.Task[None] | None = None

    def on_batch(self, key: str, payload: bytes) -> None:
        """Subscriber handler (loop thread): ``{"v": 1, "events": [event dicts]}``."""
        try:
            msg = codec.decode_message(payload)
            events = msg["events"]
            if not isinstance(events, list):
                raise ProtocolError("events is not a list")
        except (ProtocolError, KeyError) as exc:
            self.counts["bad"] += 1
            self.last_error = f"undecodable event batch: {exc}"
            return
        counts, keys = self.counts, self.snapshot_keys
        with self.lock:
            self._note_seqs((msg.get("epoch"), msg.get("seqs")))
            counts["batches"] += 1
            counts["received"] += len(events)
            for event in events:
                if not isinstance(event, dict):
                    continue
                if keys and event_key(event) in keys:
                    counts["duplicates"] += 1
                    continue
                if len(self.window) == self.window.maxlen:
                    counts["dropped"] += 1
                self.window.append(event)

    def _note_seqs(self, fields: tuple[Any, Any]) -> None:
        epoch, seqs = fields
        if not isinstance(epoch, str) or not isinstance(seqs, list) or not seqs \
                or not all(isinstance(n, int) for n in seqs):
            return
        if epoch != self.epoch:
            if self.epoch is not None:
                self.counts["owner_restarts"] += 1
            self.epoch, self.last_seq = epoch, seqs[0] - 1 if self.epoch is None else 0
        first = seqs[0]
        if first > self.last_seq + 1:
            self.counts["missed"] += first - self.last_seq - 1
        self.last_seq = max(self.last_seq, seqs[-1])

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
        with self.lock:
            return {"following": following, "window": self.window.maxlen,
                    "held": len(self.window), **self.counts, "last_error": self.last_error,
                    "epoch": self.epoch, "last_seq": self.last_seq, "owner_up": self.owner_up}


async def keep_following(stream: Stream, renew: Callable[[], Awaitable[dict[str, Any]]],
                         check_s: float | None = None) -> None:
    """Renew the follow every ``check_s`` (at most ttl/3) with ``renew()`` (the owner's
    reply), until cancelled; a renewal that gets no answer marks the owner lost."""
    def every() -> float:
        return stream.ttl_s / 3 if check_s is None else min(check_s, stream.ttl_s / 3)

    delay = every()
    while True:
        await asyncio.sleep(delay)
        try:
            reply = await renew()
        except IstosError as exc:
            # The owner may be restarting or failing over: keep the subscription and retry
            # soon; a live owner keeps publishing until the last granted ttl lapses.
            stream.counts["renew_errors"] += 1
            stream.last_error = f"follow renewal failed: {exc}"
            if stream.owner_up:
                stream.owner_up = False
                stream.counts["owner_lost"] += 1
            delay = min(1.0, every())
            continue
        stream.ttl_s = float(reply.get("ttl_s") or stream.ttl_s)
        stream.counts["renewals"] += 1
        if not stream.owner_up:
            stream.owner_up = True
            stream.counts["owner_back"] += 1
        delay = every()



async def stop_stream(stream: Stream) -> None:
    if stream.renewer is not None:
        stream.renewer.cancel()
        await asyncio.gather(stream.renewer, return_exceptions=True)
    if stream.handle is not None:
        stream.handle.close()
