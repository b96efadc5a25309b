"""Attach to a live queue from a script or a notebook: inspect it, follow its events and, only
where the queue opted in with ``admin=True``, act on it. ``with attach("jobs/email") as lq:
lq.stats(); lq.jobs(state="ready"); lq.why(job_id); lq.follow().events(); lq.dashboard()``.

Threading: a LiveQueue owns a private asyncio loop in a daemon thread (``_live.py``), and its
Zenoh session lives on that loop. Public methods are synchronous: each submits a coroutine to
that loop and waits with a bound. So the same calls work from a script and from a Jupyter cell,
where the main thread's loop is already running (``asyncio.run`` refuses there, and a session
bound to whichever loop called first would break in the next cell).

Read-only by default: attaching declares no worker and no queryable, never claims, and sends only
inspection requests plus ``follow`` (the owner then publishes its events for a while).

Caveat: a call blocks its thread until the reply (at most ``timeout_s``). If the owner is served
on that same thread's loop (``await app.start()`` in the same notebook), it cannot answer while
blocked and the call ends in ``OwnerUnavailable``: use ``await asyncio.to_thread(lq.stats)``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, TypeVar

import pandas as pd

from istos import codec
from istos.errors import ConfigError, IstosError, OwnerUnavailable, ProtocolError
from istos.queue.client import raise_for_reply
from istos.queue.config import check_queue_name
from istos.queue.state import STATES
from istos.transport.base import NoResponder, TransportError, TransportTimeout
from istos.transport.zenoh import ZenohTransport

from ._live import LoopThread, Stream, keep_following, run_bounded, stop_stream, sync_call
from .frames import events_frame

__all__ = ["attach", "LiveQueue"]

log = logging.getLogger("istos_nb.attach")
T = TypeVar("T")

# The owner caps a follow at 30 s. Every follower asking for the same ttl can never shorten
# another's window (the owner keeps only the latest deadline), so we always ask for the cap.
FOLLOW_TTL_S = 30.0
_MAX_PAGE = 1000  # the owner's page size cap for `jobs`
_MAX_EVENTS = 10_000  # the owner's cap for `events`
_OPEN_TIMEOUT_S = 10.0  # the first Zenoh session on a host takes ~0.5 s to open
_SLACK_S = 1.0  # the caller's wait beyond a request's own deadline (thread hand-offs)

_JOB_COLUMNS = {"job_id": object, "state": object, "priority": "int64", "attempts": "int64",
                "enqueued_at": "float64", "ready_at": "float64", "worker": object,
                "deadline": "float64", "last_error": object, "data": object}
_LEASE_COLUMNS = {"job_id": object, "worker": object, "deadline": "float64", "attempt": "int64"}
_DEAD_COLUMNS = {"job_id": object, "data": object, "attempts": "int64", "last_error": object,
                 "history": object, "finished_at": "float64"}


class _ReplyTooLarge(ProtocolError):
    """A reply above the codec's message cap; the caller asks again for fewer items."""


def attach(queue: str, zenoh: Any = None, *, prefix: str = "istos",
           timeout_s: float = 5.0) -> LiveQueue:
    """Open a Zenoh session of its own and attach to ``queue``'s owner; see :class:`LiveQueue`.

    ``zenoh`` takes what ``Istos(zenoh=...)`` takes (None: peer mode with multicast scouting);
    ``prefix`` must match the owner's. Raises :class:`OwnerUnavailable` if no owner answers
    within ``timeout_s`` (nothing is left running then) and ``ConfigError`` for a bad queue
    name, timeout or Zenoh config.
    """
    return LiveQueue(queue, zenoh, prefix=prefix, timeout_s=timeout_s)


class LiveQueue:
    """A read-only view of one live queue, through a Zenoh session of its own.

    Every method is synchronous and bounded by ``timeout_s``; each raises
    :class:`OwnerUnavailable` when no owner answers in time, and the typed error the owner
    answered with otherwise (``AdminDisabled`` for admin ops on a queue without ``admin=True``).
    Methods are safe to call from several threads. Use :func:`attach` to create one.
    """

    def __init__(self, queue: str, zenoh: Any = None, *, prefix: str = "istos",
                 timeout_s: float = 5.0) -> None:
        check_queue_name(queue)
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
                or not timeout_s > 0:
            raise ConfigError(f"timeout_s must be a number > 0, got {timeout_s!r}")
        self.queue, self.prefix, self.timeout_s = queue, prefix, float(timeout_s)
        self.node_id = f"attach-{secrets.token_hex(4)}"
        self.owner_node: str | None = None
        self._rpc_key = f"{prefix}/q/{queue}/rpc"
        self._events_key = f"{prefix}/q/{queue}/events"
        self._closed = False
        self._state_lock = threading.Lock()  # guards _closed and _stream transitions
        self._stream: Stream | None = None
        self._last_stream: Stream | None = None
        # Built before the thread so a bad config raises ConfigError with nothing to clean up.
        self._transport = ZenohTransport(zenoh, node_id=self.node_id)
        self._loop = LoopThread(f"istos-{self.node_id}")
        try:
            self._run(self._transport.start(), max(_OPEN_TIMEOUT_S, self.timeout_s), "open")
            self.owner_node = self._call("ping").get("node")
        except BaseException:
            self.close()
            raise

    # -- plumbing ------------------------------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, T], timeout_s: float, what: str) -> T:
        return run_bounded(self._loop, coro, timeout_s, what, self.queue)

    def _check_usable(self) -> None:
        if self._closed:
            raise IstosError(f"LiveQueue for {self.queue!r} is closed; attach() again")
        if self._loop.on_loop_thread():
            raise RuntimeError("LiveQueue methods block; they cannot run on its own loop thread")

    def _call(self, op: str, timeout_s: float | None = None, **fields: Any) -> dict[str, Any]:
        """Send ``op`` to the owner and wait for its (checked) reply, from any thread."""
        budget = self.timeout_s if timeout_s is None else timeout_s
        return self._sync(lambda: self._ask(op, budget, **fields), budget + _SLACK_S, op)

    def _sync(self, make: Callable[[], Coroutine[Any, Any, T]], timeout_s: float,
              what: str) -> T:
        """Run ``make()`` on the loop thread and wait for it, at most ``timeout_s``."""
        self._check_usable()
        return sync_call(self._loop, make, timeout_s, what, self.queue)

    async def _ask(self, op: str, timeout_s: float, **fields: Any) -> dict[str, Any]:
        """One request on the loop thread; retried while nobody serves the key (a fresh
        session's routes are still propagating, or the owner is restarting)."""
        payload = codec.encode_message({"v": codec.PROTOCOL_VERSION, "op": op, **fields})
        loop = asyncio.get_running_loop()
        deadline, pause = loop.time() + timeout_s, 0.01
        while (remaining := deadline - loop.time()) > 0:
            try:
                raw = await self._transport.query(self._rpc_key, payload, remaining)
            except NoResponder:
                await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
                pause = min(pause * 2, 0.25)  # an absent owner costs a few queries per second
                continue
            except TransportTimeout:
                break
            except TransportError as exc:
                raise OwnerUnavailable(f"queue {self.queue!r}: {op} failed: {exc}") from exc
            if len(raw) > codec.MAX_MESSAGE_BYTES:
                raise _ReplyTooLarge(f"queue {self.queue!r}: the {op} reply is {len(raw)} bytes, "
                                     f"above the {codec.MAX_MESSAGE_BYTES} message cap")
            return raise_for_reply(codec.decode_message(raw), self.queue)
        raise OwnerUnavailable(
            f"no owner of queue {self.queue!r} (prefix {self.prefix!r}) answered {op!r} within "
            f"{timeout_s:g} s (is a node serving app.queue({self.queue!r}) reachable?)")

    # -- read-only views -----------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """The owner's stats: ``counts`` per state, ``oldest_ready_age_s``, ``enqueue_rate`` and
        ``ack_rate`` (per second, last 10 s), ``totals`` per event kind since the owner started,
        ``paused``, ``admin``, ``lease_s``, ``max_attempts``, ``node``."""
        return dict(self._call("stats")["stats"])

    def jobs(self, state: str | None = None, where: dict[str, Any] | None = None,
             limit: int = 100, offset: int = 0) -> pd.DataFrame:
        """Jobs the owner holds, optionally in one ``state`` and whose decoded body matches every
        ``where`` item (keys are dotted paths: ``{"user.id": 7}``), at most ``limit`` from
        ``offset`` in the owner's order. Columns: job_id, state, priority, attempts, enqueued_at,
        ready_at, worker and deadline (leased jobs), last_error, data (the decoded body).
        Pages above the owner's 1,000-row cap are fetched in several requests."""
        if state is not None and state not in STATES:
            raise ValueError(f"state must be one of {', '.join(STATES)} or None, got {state!r}")
        if limit < 1 or offset < 0:
            raise ValueError(f"need limit >= 1 and offset >= 0, got {limit!r}, {offset!r}")
        rows: list[dict[str, Any]] = []
        size = _MAX_PAGE
        while len(rows) < limit:
            page = min(size, limit - len(rows))
            try:
                reply = self._call("jobs", state=state, where=dict(where or {}),
                                   offset=offset + len(rows), limit=page)
                got = reply["jobs"]
            except _ReplyTooLarge:
                if page == 1:  # cannot happen: one body (<= 1 MiB) fits in one message
                    raise
                size = max(1, page // 2)  # big bodies: smaller pages
                continue
            rows.extend({**r, "data": _decode(r.get("body"))} for r in got)
            if not got or (len(got) < page and not reply.get("more")):  # more: cut by bytes
                break
        return _table(_JOB_COLUMNS, rows)

    def dead_letters(self, limit: int | None = None) -> pd.DataFrame:
        """Dead jobs, oldest first: job_id, data (decoded), attempts, last_error, history (one
        dict per attempt), finished_at. The owner pages its answer; every page is fetched unless
        ``limit`` caps the number of rows."""
        dead: list[dict[str, Any]] = []
        page_size = 1000
        while limit is None or len(dead) < limit:
            want = page_size if limit is None else min(page_size, limit - len(dead))
            try:
                reply = self._call("dead", offset=len(dead), limit=want)
            except _ReplyTooLarge:
                if page_size == 1:
                    raise
                page_size = max(1, page_size // 4)  # big histories: smaller pages
                continue
            dead.extend(reply["dead"])
            if not reply["dead"] or not reply.get("more", len(dead) < reply.get("total", 0)):
                break
        return _table(_DEAD_COLUMNS, [{**d, "data": _decode(d.get("body"))} for d in dead])

    def leases(self) -> pd.DataFrame:
        """Live leases: job_id, worker (slot id ``node:function#slot``), deadline, attempt."""
        return _table(_LEASE_COLUMNS, self._call("leases")["leases"])

    def why(self, job_id: str) -> dict[str, Any]:
        """Why a job is (not) running: ``state``, ``reason`` in words, and the fields behind it
        (``ahead``, ``worker``, ``until``, ``attempts``, ``last_error``, ``dead_letter``)."""
        out = dict(self._call("why", job_id=str(job_id))["why"])
        dead = out.get("dead_letter")
        if isinstance(dead, dict) and "body" in dead:
            body = dead.pop("body")  # shown decoded, as in dead_letters()
            out["dead_letter"] = {**dead, "data": _decode(body)}
        return out

    def events(self, limit: int = 1000) -> pd.DataFrame:
        """The latest ``limit`` events as :func:`istos_nb.frames.events_frame`.

        While following: the rolling window (the owner's ring at follow time merged with the
        live stream, de-duplicated). Otherwise a snapshot of the owner's ring: at most 10,000
        events, and fewer when they do not fit in one reply (~6,000 typical events).
        """
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit!r}")
        stream = self._stream
        if stream is not None:
            return events_frame(stream.tail(limit))
        return events_frame(self._sync(lambda: self._ring(limit), 4 * self.timeout_s, "events"))

    async def _ring(self, limit: int) -> list[dict[str, Any]]:
        """The owner's latest ``limit`` events, fewer if they do not fit in one reply (its
        ring cannot be paged: halve until the most recent ones fit)."""
        ask = min(limit, _MAX_EVENTS)
        while True:
            try:
                return list((await self._ask("events", self.timeout_s, limit=ask))["events"])
            except _ReplyTooLarge:
                if ask == 1:
                    raise
                ask //= 2

    # -- following -----------------------------------------------------------------------------
    def follow(self, window: int = 10_000) -> LiveQueue:
        """Start following the owner's live events into a window of the latest ``window``.

        Subscribes, asks the owner to publish (renewed every ttl/3 from the background loop, so
        the stream never lapses while following), then merges the owner's recent ring. Calling
        it while following only resizes the window. Returns self (``attach(q).follow()``).
        """
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        self._check_usable()
        with self._state_lock:
            if self._stream is not None:
                self._stream.resize(window)
                return self
            stream = Stream(window, FOLLOW_TTL_S)
            self._sync(lambda: self._start_follow(stream), 4 * self.timeout_s, "follow")
            self._stream = self._last_stream = stream
        return self

    def unfollow(self) -> None:
        """Stop following (idempotent). The owner stops publishing when its ttl lapses (<= 30 s)
        unless another follower renews it; ``events()`` goes back to ring snapshots."""
        with self._state_lock:
            stream, self._stream = self._stream, None
        if stream is not None and self._loop.alive:
            self._run(stop_stream(stream), self.timeout_s, "unfollow")

    @property
    def following(self) -> bool:
        return self._stream is not None

    @property
    def stream_stats(self) -> dict[str, Any]:
        """Counters of the current (or last) follow; see ``istos_nb._live.Stream`` for their
        meaning."""
        stream = self._stream or self._last_stream
        if stream is None:
            return Stream(1, FOLLOW_TTL_S).stats(False) | {"window": None}
        return stream.stats(stream is self._stream)

    async def _start_follow(self, stream: Stream) -> None:
        # Subscribe first: the declaration travels ahead of the follow request on the link, so
        # the owner already routes to us when it starts publishing.
        stream.handle = await self._transport.declare_subscriber(self._events_key,
                                                                 stream.on_batch)
        try:
            reply = await self._ask("follow", self.timeout_s, ttl_s=FOLLOW_TTL_S)
            stream.ttl_s = float(reply.get("ttl_s") or FOLLOW_TTL_S)
            stream.merge_snapshot(await self._ring(stream.window.maxlen or 1))
        except BaseException:
            stream.handle.close()
            raise
        stream.renewer = asyncio.get_running_loop().create_task(keep_following(
            stream, lambda: self._ask("follow", self.timeout_s, ttl_s=FOLLOW_TTL_S)))

    # -- admin (the owner refuses these with AdminDisabled unless admin=True) ------------------
    def requeue(self, job_id: str) -> str:
        """Enqueue dead job ``job_id``'s body again under a new id, returned. The dead letter
        stays (purge it to drop it). Raises LookupError if the queue holds no such dead job."""
        new_id = self._call("requeue", job_id=str(job_id)).get("job_id")
        if new_id is None:
            raise LookupError(f"queue {self.queue!r} holds no dead job {job_id!r} to requeue "
                              "(see dead_letters())")
        return str(new_id)

    def purge_dead(self, job_ids: Iterable[str] | None = None) -> int:
        """Delete the given dead letters (all of them when None); returns how many went."""
        if isinstance(job_ids, str):
            job_ids = [job_ids]  # one id, not its characters
        fields = {} if job_ids is None else {"job_ids": [str(j) for j in job_ids]}
        return int(self._call("purge_dead", **fields)["purged"])

    def pause(self) -> None:
        """Stop claims: workers get no job until :meth:`resume` (leases in flight carry on)."""
        self._call("pause")

    def resume(self) -> None:
        """Let workers claim again (the owner nudges them)."""
        self._call("resume")

    # -- widgets, lifecycle --------------------------------------------------------------------
    def dashboard(self, refresh_s: float = 2.0) -> Any:
        """An ipywidgets dashboard of this queue, refreshed every ``refresh_s`` seconds."""
        from .widgets import LiveDashboard  # lazy: ipywidgets only for those who ask

        return LiveDashboard(self, refresh_s=refresh_s)

    def close(self) -> None:
        """Stop following, close the Zenoh session and the background loop. Idempotent."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            stream, self._stream = self._stream, None
        if self._loop.alive:
            try:
                self._loop.run(self._shutdown(stream), _OPEN_TIMEOUT_S)
            except Exception as exc:  # closing must not fail; the loop goes down regardless
                log.debug("closing %r: %s", self, exc)
            self._loop.stop(_OPEN_TIMEOUT_S)

    async def _shutdown(self, stream: Stream | None) -> None:
        if stream is not None:
            await stop_stream(stream)
        await self._transport.close()

    def __enter__(self) -> LiveQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        head = f"LiveQueue({self.queue!r}, prefix={self.prefix!r}"
        if self._closed:
            return head + ", closed)"
        try:  # a short bound: a repr must not hang a notebook for the full timeout
            s = self._call("stats", timeout_s=min(self.timeout_s, 1.0))["stats"]
        except (IstosError, RuntimeError) as exc:
            return f"{head}, unavailable: {type(exc).__name__})"
        counts = " ".join(f"{k}={v}" for k, v in s.get("counts", {}).items())
        totals = s.get("totals", {})
        extra = " paused" if s.get("paused") else ""
        if self._stream is not None:
            extra += f" following({self._stream.counts['received']} received)"
        return (f"{head}, owner={s.get('node')!r}: {counts}; enqueued={totals.get('enqueued')} "
                f"acked={totals.get('acked')}{extra})")


def _decode(raw: Any) -> Any:
    """A job body for display: decoded msgpack, or the raw bytes if it is not msgpack."""
    if not isinstance(raw, bytes):
        return raw
    try:
        return codec.decode_body(raw)
    except Exception:  # msgpack raises several unrelated types; show the bytes instead
        return raw


def _table(columns: dict[str, Any], rows: list[dict[str, Any]]) -> pd.DataFrame:
    """A frame with fixed columns and dtypes, also without rows (callers never special-case)."""
    return pd.DataFrame({name: pd.Series([r.get(name) for r in rows], dtype=dtype)
                         for name, dtype in columns.items()}, columns=list(columns))
