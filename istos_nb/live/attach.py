"""Attach to a live queue from a script, a thread or a notebook: inspect it, follow its events
and, only where the queue opted in with ``admin=True``, act on it. ``with attach("jobs/email")
as q: q.stats(); q.jobs(state="ready"); q.why(job_id); q.job(job_id); q.follow().events()``.

One module at two layers: this implementation, and its public name :mod:`istos_nb.attach`.

Threading: a LiveQueue owns a private asyncio loop in a daemon thread (``loop.py``), and its
Zenoh session lives on that loop; every request runs there. Plain methods submit to it and wait
with a bound, so they work from a script, from any thread, and from a Jupyter cell: when the
calling thread runs an event loop (a notebook kernel, ``asyncio.run``), that loop keeps running
while the call waits (``_reenter.py``), so an owner served on it (``await app.start()`` in the
same notebook) answers as usual. Async code awaits the ``a``-prefixed twins instead
(``await q.astats()``, ``await q.ajobs(...)``; the convention of Django's async ORM), which never
block the caller's loop at all.

Read-only by default: attaching declares no worker and no queryable, never claims, and sends only
inspection requests plus ``follow`` (the owner then publishes its events for a while).

Public as :mod:`istos_nb.attach`, which re-exports this module's ``__all__`` (one module at
two layers: the public name, and this implementation).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import threading
from collections.abc import Callable, Coroutine, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import pandas as pd

from istos.client.follow import Follower
from istos.client.pausing import pause_fields, resume_fields
from istos.core.config import check_queue_name
from istos.deprecation import renamed
from istos.errors import ConfigError, IstosError, JobNotFound
from istos.lifecycle import UNSET
from istos.payload import CodecChain, PayloadCodec
from istos.protocol import MAX_BULK, MAX_PAGE
from istos.transport.zenoh import ZenohTransport

from . import reply_tables as lf
from .loop import LoopThread, Stream, async_call, start_stream, stop_stream, sync_call
from .owner_series import fetch_series, series_args
from .record import check_seconds, record_on_loop
from .requests import OwnerRequests, jobs_args, purge_fields, search_filters, update_fields

if TYPE_CHECKING:
    from ..data.trace import Trace

__all__ = ["attach", "aattach", "LiveQueue"]

log = logging.getLogger("istos_nb.live.attach")
T = TypeVar("T")

# The owner caps a follow at 30 s. Every follower asking for the same ttl can never shorten
# another's window (the owner keeps only the latest deadline), so we always ask for the cap.
FOLLOW_TTL_S = 30.0
_OPEN_TIMEOUT_S = 10.0  # the first Zenoh session on a host takes ~0.5 s to open
_SLACK_S = 1.0  # the caller's wait beyond a request's own deadline (thread hand-offs)
_ALL_PAGES_S = 3600.0  # the bound of a whole paged fetch (each page has its own timeout)


def attach(queue: str, zenoh: Any = None, *, prefix: str = "istos",
           timeout_s: float = 5.0, codecs: Iterable[PayloadCodec] = ()) -> LiveQueue:
    """Open a Zenoh session of its own and attach to ``queue``'s owner; see :class:`LiveQueue`.

    ``zenoh`` takes what ``Istos(zenoh=...)`` takes (None: peer mode with multicast scouting);
    ``prefix`` must match the owner's. ``codecs``: the queue's payload codecs
    (``istos.payload``), to show bodies encoded with them decoded; without them such a body
    shows as what it is encoded with. Raises :class:`OwnerUnavailable` if no owner answers
    within ``timeout_s`` (nothing is left running then) and ``ConfigError`` for a bad queue
    name, timeout, codec or Zenoh config.
    """
    return LiveQueue(queue, zenoh, prefix=prefix, timeout_s=timeout_s, codecs=codecs)


async def aattach(queue: str, zenoh: Any = None, *, prefix: str = "istos",
                  timeout_s: float = 5.0, codecs: Iterable[PayloadCodec] = ()) -> LiveQueue:
    """As :func:`attach`, awaitable: the caller's loop runs freely while the session opens.
    Raises what :func:`attach` raises, with nothing left running."""
    lq = LiveQueue(queue, zenoh, prefix=prefix, timeout_s=timeout_s, codecs=codecs,
                   _connect=False)
    try:
        await lq._awaiting(lq._connect, "open", max(_OPEN_TIMEOUT_S, lq.timeout_s) + _SLACK_S)
    except BaseException:
        await asyncio.to_thread(lq.close)
        raise
    return lq


class LiveQueue:
    """A read-only view of one live queue, through a Zenoh session of its own.

    Every method is bounded by ``timeout_s`` per request; each raises :class:`OwnerUnavailable`
    when no owner answers in time, and the typed error the owner answered with otherwise
    (``AdminDisabled`` for admin ops on a queue without ``admin=True``). Methods are safe to call
    from several threads; each has an awaitable twin named with an ``a`` prefix. Instants in the
    returned frames and dicts are UTC pandas Timestamps, durations Timedeltas. Use
    :func:`attach` (or :func:`aattach`) to create one. Every method raises
    :class:`IstosError` once the LiveQueue is closed, and ``RuntimeError`` when called from
    its own loop thread (a callback it runs). With the queue's payload ``codecs`` its frames
    show encoded bodies decoded; without them, as what they are encoded with. A ``where``
    search cannot look inside encoded bodies: ``jobs(...).attrs["unsearched"]`` counts those
    it met.
    """

    def __init__(self, queue: str, zenoh: Any = None, *, prefix: str = "istos",
                 timeout_s: float = 5.0, codecs: Iterable[PayloadCodec] = (),
                 _connect: bool = True) -> None:
        check_queue_name(queue)
        payload = CodecChain(codecs)  # ConfigError for a codec that is not one
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
                or not timeout_s > 0:
            raise ConfigError(f"timeout_s must be a number > 0, got {timeout_s!r}")
        self.queue, self.prefix, self.timeout_s = queue, prefix, float(timeout_s)
        self.node_id = f"attach-{secrets.token_hex(4)}"
        self.owner_node: str | None = None
        self._closed = False
        self._state_lock = threading.Lock()  # guards _closed and _stream transitions
        self._stream: Stream | None = None
        self._last_stream: Stream | None = None
        # Built before the thread so a bad config raises ConfigError with nothing to clean up.
        self._transport = ZenohTransport(zenoh, node_id=self.node_id)
        self._req = OwnerRequests(self._transport, queue, prefix, self.timeout_s, payload)
        self._loop = LoopThread(f"istos-{self.node_id}")
        if _connect:
            try:
                self._blocking(self._connect, "open", max(_OPEN_TIMEOUT_S, self.timeout_s))
            except BaseException:
                self.close()
                raise

    async def _connect(self) -> None:
        await self._transport.start()
        self.owner_node = (await self._req.ask("ping")).get("node")

    # -- plumbing ------------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._closed:
            raise IstosError(f"LiveQueue for {self.queue!r} is closed; attach() again")
        if self._loop.on_loop_thread():
            raise RuntimeError("LiveQueue methods block; they cannot run on its own loop thread")

    def _blocking(self, make: Callable[[], Coroutine[Any, Any, T]], what: str,
                  timeout_s: float | None = None) -> T:
        """Run ``make()`` on the loop thread and wait for it (a plain call)."""
        self._check_usable()
        bound = self.timeout_s + _SLACK_S if timeout_s is None else timeout_s
        return sync_call(self._loop, make, bound, what, self.queue)

    async def _awaiting(self, make: Callable[[], Coroutine[Any, Any, T]], what: str,
                        timeout_s: float | None = None) -> T:
        """Run ``make()`` on the loop thread and await it (an ``a``-prefixed twin)."""
        self._check_usable()
        bound = self.timeout_s + _SLACK_S if timeout_s is None else timeout_s
        return await async_call(self._loop, make, bound, what, self.queue)

    # -- read-only views -----------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """The owner's stats: ``counts`` per state, ``oldest_ready_age_s``, ``enqueue_rate`` and
        ``ack_rate`` (per second, last 10 s), ``totals`` per event kind since the owner started,
        ``paused``, ``policy`` (lease_s, max_attempts, retry_backoff_s, retry_backoff_max_s,
        retry_jitter, keep_results, result_ttl_s, admin: as declared), ``admin``, ``node``.
        Raises :class:`OwnerUnavailable` if no owner answers."""
        return self._blocking(self._req.stats, "stats")

    async def astats(self) -> dict[str, Any]:
        """As :meth:`stats`, awaitable: the caller's loop runs while it waits."""
        return await self._awaiting(self._req.stats, "stats")

    def jobs(self, state: str | Iterable[str] | None = None, where: dict[str, Any] | None = None,
             limit: int | None = 100, offset: int = 0, *, error: str | None = None,
             worker: str | None = None, enqueued: Any = None,
             finished: Any = None) -> pd.DataFrame:
        """Jobs the owner holds, optionally in one ``state`` (or several: merged, oldest first)
        and whose decoded body matches every ``where`` item (dotted paths: ``{"user.id": 7}``),
        at most ``limit`` (None: every page) from ``offset`` in the owner's order. Columns:
        job_id, state, priority, attempts, enqueued_at, ready_at, worker and deadline (leased
        jobs), last_error, data (the decoded body). ``attrs["truncated"]`` says whether rows
        were left out; ``attrs["total"]`` how many match in all (None when a ``where`` search
        stopped early and the owner does not say). The search: ``error`` (the last error
        contains it), ``worker`` (some attempt's worker contains it), ``enqueued`` and
        ``finished`` as ``(after, before)`` instants (epoch seconds, datetimes; an end None).
        Raises :class:`ConfigError` for a bad state, limit, offset or filter (nothing sent) and
        :class:`OwnerUnavailable` if no owner answers."""
        args = jobs_args(state, where, limit, offset)
        filters = search_filters(error, worker, enqueued, finished)
        bound = _ALL_PAGES_S if limit is None or limit > MAX_PAGE else None
        return self._blocking(lambda: self._req.jobs(*args, filters), "jobs", bound)

    async def ajobs(self, state: str | Iterable[str] | None = None,
                    where: dict[str, Any] | None = None, limit: int | None = 100,
                    offset: int = 0, *, error: str | None = None, worker: str | None = None,
                    enqueued: Any = None, finished: Any = None) -> pd.DataFrame:
        """As :meth:`jobs`, awaitable: the caller's loop runs while it waits."""
        args = jobs_args(state, where, limit, offset)
        filters = search_filters(error, worker, enqueued, finished)
        bound = _ALL_PAGES_S if limit is None or limit > MAX_PAGE else None
        return await self._awaiting(lambda: self._req.jobs(*args, filters), "jobs", bound)

    def workers(self) -> pd.DataFrame:
        """The workers the owner has seen claim or renew lately, one row per runner
        (``node:function``): node, slots, concurrency, prefetch (-1: automatic), heartbeat,
        held_count and held (job ids), first_seen, last_seen, and what happened to its
        deliveries: claimed, acked, nacked, expired, released (the owner's counts).
        Raises :class:`OwnerUnavailable` if no owner answers."""
        return self._blocking(self._req.workers, "workers")

    async def aworkers(self) -> pd.DataFrame:
        """As :meth:`workers`, awaitable: the caller's loop runs while it waits."""
        return await self._awaiting(self._req.workers, "workers")

    def job(self, job_id: str) -> dict[str, Any]:
        """One job in detail: ``state``, ``record`` (the owner's summary, instants as
        Timestamps), ``why`` (as :meth:`why`), ``attempts`` (one row per delivery: attempt,
        worker, claimed_at, finished_at, outcome, error, backoff), ``data`` (the decoded
        body) and ``logs`` (its ``ctx.log()`` lines: ``{attempt, line}``, oldest first).
        Raises :class:`JobNotFound` (a ``LookupError``) if the queue holds no such job, and
        :class:`OwnerUnavailable` if no owner answers."""
        return self._blocking(lambda: self._req.job(str(job_id)), "job")

    async def ajob(self, job_id: str) -> dict[str, Any]:
        """As :meth:`job`, awaitable: the caller's loop runs while it waits."""
        return await self._awaiting(lambda: self._req.job(str(job_id)), "job")

    def dead_letters(self, limit: int | None = None) -> pd.DataFrame:
        """Dead jobs, oldest first: job_id, data (decoded), attempts, last_error, history (one
        dict per attempt), finished_at. Every page is fetched unless ``limit`` caps the rows.
        Raises :class:`OwnerUnavailable` if no owner answers."""
        return self._blocking(lambda: self._req.dead(limit), "dead", _ALL_PAGES_S)

    async def adead_letters(self, limit: int | None = None) -> pd.DataFrame:
        """As :meth:`dead_letters`, awaitable: the caller's loop runs while it waits."""
        return await self._awaiting(lambda: self._req.dead(limit), "dead", _ALL_PAGES_S)

    def batches(self, limit: int = 100) -> pd.DataFrame:
        """The batches this queue is home to, unfinished first, then newest first (at most
        ``limit``, up to 1,000): batch_id, description, closed, total, pending, done, dead,
        cancelled, created_at and finished_at (epoch seconds, None while unfinished),
        parent_id (a child batch's parent), callbacks (``{kind: {queue, fired_at}}``).
        ``attrs["total"]`` and ``attrs["open"]`` count every batch held. Raises
        :class:`ConfigError` for a bad ``limit`` and :class:`OwnerUnavailable` if no owner
        answers."""
        bound = _check_batch_limit(limit)
        return self._blocking(lambda: self._req.batches(bound), "batches")

    async def abatches(self, limit: int = 100) -> pd.DataFrame:
        """As :meth:`batches`, awaitable: the caller's loop runs while it waits."""
        bound = _check_batch_limit(limit)
        return await self._awaiting(lambda: self._req.batches(bound), "batches")

    def batch_members(self, batch_id: str, state: str | None = None,
                      limit: int = 1000) -> pd.DataFrame:
        """The members of batch ``batch_id`` (whose home is this queue) as it counts them:
        job_id, queue, state (pending, done, dead, cancelled), in job id order, only those
        in ``state`` if given, at most ``limit``; ``attrs["more"]`` says whether rows were
        left out. Raises :class:`JobNotFound` when this queue holds no such batch,
        :class:`ConfigError` for a bad ``limit`` and :class:`OwnerUnavailable` if no owner
        answers."""
        bound = _check_batch_limit(limit)
        return self._blocking(lambda: self._req.batch_members(str(batch_id), state, bound),
                              "batch_members")

    async def abatch_members(self, batch_id: str, state: str | None = None,
                             limit: int = 1000) -> pd.DataFrame:
        """As :meth:`batch_members`, awaitable: the caller's loop runs while it waits."""
        bound = _check_batch_limit(limit)
        return await self._awaiting(
            lambda: self._req.batch_members(str(batch_id), state, bound), "batch_members")

    def series(self, since: Any = None, resolution: Any = None) -> pd.DataFrame:
        """The owner's time series of the queue: one row per second ("1s", the last hour) or
        minute ("1min", the last day) from ``since`` (None: all it keeps) up to now, indexed
        by the bucket's start (UTC datetimes): counts by state at the bucket's end, events in
        it, wait and run time quantiles (see :mod:`istos_nb.data.series`). Its last row
        agrees with :meth:`stats`: the owner's counts, not a reconstruction from events.
        Raises :class:`ConfigError` for a bad ``since`` or ``resolution`` and
        :class:`OwnerUnavailable` if no owner answers."""
        args = series_args(since, resolution)
        return self._blocking(lambda: fetch_series(self._req, *args), "series", _ALL_PAGES_S)

    async def aseries(self, since: Any = None, resolution: Any = None) -> pd.DataFrame:
        """As :meth:`series`, awaitable: the caller's loop runs while it waits."""
        args = series_args(since, resolution)
        return await self._awaiting(lambda: fetch_series(self._req, *args), "series",
                                    _ALL_PAGES_S)

    def leases(self) -> pd.DataFrame:
        """Live leases, one row per leased job: job_id, worker (slot id
        ``node:function#slot``), deadline, attempt. Raises :class:`OwnerUnavailable` if no
        owner answers."""
        return self._blocking(self._req.leases, "leases")

    async def aleases(self) -> pd.DataFrame:
        """As :meth:`leases`, awaitable: the caller's loop runs while it waits."""
        return await self._awaiting(self._req.leases, "leases")

    def why(self, job_id: str) -> dict[str, Any]:
        """Why a job is (not) running: ``state``, ``reason`` in words and relative times
        ("leased by w1 for 2.0 s more"), and the fields behind it (``ahead``, ``worker``,
        ``until``, ``attempts``, ``last_error``, ``dead_letter``). A job the queue does not
        hold reads ``state`` "unknown" with the reason. Raises :class:`OwnerUnavailable` if
        no owner answers."""
        return self._blocking(lambda: self._req.why(str(job_id)), "why")

    async def awhy(self, job_id: str) -> dict[str, Any]:
        """As :meth:`why`, awaitable: the caller's loop runs while it waits."""
        return await self._awaiting(lambda: self._req.why(str(job_id)), "why")

    def events(self, limit: int = 1000) -> pd.DataFrame:
        """The latest ``limit`` events as :func:`istos_nb.data.frames.events_frame`, with ``t``,
        ``ready_at`` and ``deadline`` as UTC instants and ``delay_s`` a Timedelta.

        While following: the rolling window (the owner's ring at follow time merged with the
        live stream, de-duplicated). Otherwise a snapshot of the owner's ring: at most 10,000
        events, and fewer when they do not fit in one reply (~6,000 typical events).
        Raises :class:`ConfigError` for ``limit < 1`` and :class:`OwnerUnavailable` if no
        owner answers.
        """
        return lf.live_events(self.raw_events(limit))

    async def aevents(self, limit: int = 1000) -> pd.DataFrame:
        """As :meth:`events`, awaitable: the caller's loop runs while it waits."""
        return lf.live_events(await self.araw_events(limit))

    def raw_events(self, limit: int = 1000) -> list[dict[str, Any]]:
        """:meth:`events` as the owner's event dicts (``t`` in epoch seconds), oldest first.
        Raises :class:`ConfigError` for ``limit < 1`` and :class:`OwnerUnavailable` if no
        owner answers."""
        if limit < 1:
            raise ConfigError(f"limit must be >= 1, got {limit!r}")
        stream = self._stream
        if stream is not None:
            return stream.tail(limit)
        return self._blocking(lambda: self._req.ring(limit), "events", 4 * self.timeout_s)

    async def araw_events(self, limit: int = 1000) -> list[dict[str, Any]]:
        """As :meth:`raw_events`, awaitable: the caller's loop runs while it waits."""
        if limit < 1:
            raise ConfigError(f"limit must be >= 1, got {limit!r}")
        stream = self._stream
        if stream is not None:
            return stream.tail(limit)
        return await self._awaiting(lambda: self._req.ring(limit), "events", 4 * self.timeout_s)

    # -- following -----------------------------------------------------------------------------
    def follow(self, window: int = 10_000) -> LiveQueue:
        """Start following the owner's live events into a window of the latest ``window``.

        Subscribes, asks the owner to publish (renewed every ttl/3 from the background loop, so
        the stream never lapses while following), then merges the owner's recent ring. Calling
        it while following only resizes the window. Returns self (``attach(q).follow()``).
        Raises :class:`ConfigError` for ``window < 1`` and :class:`OwnerUnavailable` if no
        owner answers (nothing is left following then).
        """
        stream = self._begin_follow(window)
        if stream is not None:
            try:
                self._blocking(lambda: self._start_follow(stream), "follow", 4 * self.timeout_s)
            except BaseException:
                self._abandon(stream)
                raise
        return self

    async def afollow(self, window: int = 10_000) -> LiveQueue:
        """As :meth:`follow`, awaitable: the caller's loop runs while it waits."""
        stream = self._begin_follow(window)
        if stream is not None:
            try:
                await self._awaiting(lambda: self._start_follow(stream), "follow",
                                     4 * self.timeout_s)
            except BaseException:
                self._abandon(stream)
                raise
        return self

    def _begin_follow(self, window: int) -> Stream | None:
        """The new stream to start (claimed under the lock), or None after a resize."""
        if window < 1:
            raise ConfigError(f"window must be >= 1, got {window!r}")
        self._check_usable()
        with self._state_lock:
            if self._stream is not None:
                self._stream.resize(window)
                return None
            stream = self._stream = self._last_stream = Stream(window, FOLLOW_TTL_S)
            return stream

    def _abandon(self, stream: Stream) -> None:
        with self._state_lock:
            if self._stream is stream:
                self._stream = None

    def unfollow(self) -> None:
        """Stop following (idempotent). The owner stops publishing when its ttl lapses (<= 30 s)
        unless another follower renews it; ``events()`` goes back to ring snapshots. Sends
        nothing to the owner, so it never waits for one."""
        with self._state_lock:
            stream, self._stream = self._stream, None
        if stream is not None and self._loop.alive:
            self._blocking(lambda: stop_stream(stream), "unfollow")

    async def aunfollow(self) -> None:
        """As :meth:`unfollow`, awaitable: the caller's loop runs while it waits."""
        with self._state_lock:
            stream, self._stream = self._stream, None
        if stream is not None and self._loop.alive:
            await self._awaiting(lambda: stop_stream(stream), "unfollow")

    @property
    def following(self) -> bool:
        """Whether this LiveQueue follows the owner's events (between :meth:`follow` and
        :meth:`unfollow` or :meth:`close`)."""
        return self._stream is not None

    @property
    def stream_stats(self) -> dict[str, Any]:
        """Counters of the current (or last) follow; see ``istos_nb.live.loop.Stream`` for their
        meaning."""
        stream = self._stream or self._last_stream
        if stream is None:
            return Stream(1, FOLLOW_TTL_S).stats(False) | {"window": None}
        return stream.stats(stream is self._stream)

    async def _start_follow(self, stream: Stream) -> None:
        # The engine's follower subscribes first (the declaration travels ahead of the follow
        # request on the link, so the owner already routes to us when it starts publishing),
        # then the owner's ring, taken once it publishes, goes before what streamed live.
        follower = Follower(self._transport, self._req.clients(self.queue), ttl_s=FOLLOW_TTL_S)
        await start_stream(stream, follower)
        try:
            stream.merge_snapshot(await self._req.ring(stream.window.maxlen or 1))
        except BaseException:
            await stop_stream(stream)
            raise

    # -- recording -----------------------------------------------------------------------------
    def record(self, seconds: float, *, bodies: bool = False,
               on_start: Callable[[], None] | None = None) -> Trace:
        """Follow the queue for ``seconds`` and return what happened as a replayable
        :class:`~istos_nb.data.trace.Trace` (policy from ``stats``, the fleet seen, per job and
        per attempt what the owner saw); ``bodies=True`` keeps bodies seen waiting;
        ``on_start()`` is called (from this LiveQueue's thread) once the owner publishes to the
        recording. See ``istos_nb.live.record``; ``istos record`` writes the same as a file.
        Raises :class:`ConfigError` for ``seconds`` not a finite number > 0 and
        :class:`OwnerUnavailable` if no owner answers."""
        check_seconds(seconds)
        return self._blocking(lambda: self._record(float(seconds), bodies, on_start),
                              "record", float(seconds) + 4 * self.timeout_s)

    async def arecord(self, seconds: float, *, bodies: bool = False,
                      on_start: Callable[[], None] | None = None) -> Trace:
        """As :meth:`record`, awaitable: the caller's loop runs while it waits."""
        check_seconds(seconds)
        return await self._awaiting(
            lambda: self._record(float(seconds), bodies, on_start), "record",
            float(seconds) + 4 * self.timeout_s)

    def _record(self, seconds: float, bodies: bool,
                on_start: Callable[[], None] | None) -> Coroutine[Any, Any, Trace]:
        return record_on_loop(self._transport, self._req.clients(self.queue), seconds, bodies,
                              on_start)

    # -- admin (the owner refuses these with AdminDisabled unless admin=True) ------------------
    def resubmit(self, job_id: str) -> str:
        """Enqueue dead job ``job_id``'s body again under a new id, returned (a new job: no
        workflow meta; ``app.revive`` brings the dead job itself back). The dead letter stays
        (purge it to drop it); resubmitting it again returns the same id and makes no second
        job. Raises :class:`JobNotFound` (a ``LookupError``) if the queue holds no such dead
        job, and :class:`AdminDisabled` on a queue declared without ``admin=True``. Sent as
        the ``requeue`` op."""
        return self._resubmitted(job_id, self._blocking(
            lambda: self._req.admin("requeue", job_id=str(job_id)), "requeue"))

    async def aresubmit(self, job_id: str) -> str:
        """As :meth:`resubmit`, awaitable: the caller's loop runs while it waits."""
        return self._resubmitted(job_id, await self._awaiting(
            lambda: self._req.admin("requeue", job_id=str(job_id)), "requeue"))

    def requeue(self, job_id: str) -> str:
        """Deprecated alias of :meth:`resubmit` (kept one release): warns with a
        :class:`DeprecationWarning`, then is that call, raising what it raises."""
        renamed("LiveQueue.requeue", "LiveQueue.resubmit")
        return self.resubmit(job_id)

    def arequeue(self, job_id: str) -> Coroutine[Any, Any, str]:
        """Deprecated alias of :meth:`aresubmit` (kept one release): warns with a
        :class:`DeprecationWarning`, then is that call, raising what it raises."""
        renamed("LiveQueue.arequeue", "LiveQueue.aresubmit")
        return self.aresubmit(job_id)

    def _resubmitted(self, job_id: str, reply: dict[str, Any]) -> str:
        if reply.get("job_id") is None:
            raise JobNotFound(f"queue {self.queue!r} holds no dead job {job_id!r} to resubmit "
                              "(see dead_letters())")
        return str(reply["job_id"])

    def purge_dead(self, job_ids: Iterable[str] | None = None, *,
                   older_than_s: float | None = None) -> int:
        """Delete the given dead letters (all of them when None), or with ``older_than_s``
        those that died at least that long ago; returns how many went. Raises
        :class:`ConfigError` when given both, and :class:`AdminDisabled` on a queue declared
        without ``admin=True``."""
        return self._blocking(lambda: self._purge(job_ids, older_than_s), "purge_dead",
                              _ALL_PAGES_S)

    async def apurge_dead(self, job_ids: Iterable[str] | None = None, *,
                          older_than_s: float | None = None) -> int:
        """As :meth:`purge_dead`, awaitable: the caller's loop runs while it waits."""
        return await self._awaiting(lambda: self._purge(job_ids, older_than_s), "purge_dead",
                                    _ALL_PAGES_S)

    async def _purge(self, job_ids: Iterable[str] | None, older_than_s: float | None) -> int:
        if older_than_s is not None:
            if job_ids is not None:
                raise ConfigError("purge_dead: give job_ids or older_than_s, not both")
            return await self._req.bulk("purge_dead_older", "purged",
                                        older_than_s=float(older_than_s))
        reply = await self._req.admin("purge_dead", **purge_fields(job_ids))
        return int(reply["purged"])

    def redrive_dead(self, error: str | None = None) -> int:
        """Every dead letter (only those whose last error contains ``error``, if given) back
        to ready under its own id, afresh, as ``app.revive`` does for one; returns how many.
        Bounded requests (the ``requeue_all_dead`` op), repeated. Raises
        :class:`AdminDisabled` on a queue declared without ``admin=True``."""
        return self._blocking(lambda: self._redrive_all(error), "requeue_all_dead",
                              _ALL_PAGES_S)

    async def aredrive_dead(self, error: str | None = None) -> int:
        """As :meth:`redrive_dead`, awaitable: the caller's loop runs while it waits."""
        return await self._awaiting(lambda: self._redrive_all(error), "requeue_all_dead",
                                    _ALL_PAGES_S)

    def requeue_dead(self, error: str | None = None) -> int:
        """Deprecated alias of :meth:`redrive_dead` (kept one release): warns with a
        :class:`DeprecationWarning`, then is that call, raising what it raises."""
        renamed("LiveQueue.requeue_dead", "LiveQueue.redrive_dead")
        return self.redrive_dead(error)

    def arequeue_dead(self, error: str | None = None) -> Coroutine[Any, Any, int]:
        """Deprecated alias of :meth:`aredrive_dead` (kept one release): warns with a
        :class:`DeprecationWarning`, then is that call, raising what it raises."""
        renamed("LiveQueue.arequeue_dead", "LiveQueue.aredrive_dead")
        return self.aredrive_dead(error)

    async def _redrive_all(self, error: str | None) -> int:
        fields = {} if error is None else {"error": str(error)}
        return await self._req.bulk("requeue_all_dead", "requeued", **fields)

    def promote(self, job_ids: Iterable[str] | None = None) -> int:
        """Delayed jobs (the given ids, or all) made ready now; returns how many. Raises
        :class:`AdminDisabled` on a queue declared without ``admin=True``."""
        return self._blocking(lambda: self._promote(job_ids), "promote", _ALL_PAGES_S)

    async def apromote(self, job_ids: Iterable[str] | None = None) -> int:
        """As :meth:`promote`, awaitable: the caller's loop runs while it waits."""
        return await self._awaiting(lambda: self._promote(job_ids), "promote", _ALL_PAGES_S)

    async def _promote(self, job_ids: Iterable[str] | None) -> int:
        if job_ids is None:
            return await self._req.bulk("promote", "promoted")
        ids = purge_fields(job_ids)["job_ids"]
        total = 0
        for start in range(0, len(ids), MAX_BULK):
            reply = await self._req.admin("promote", job_ids=ids[start:start + MAX_BULK])
            total += int(reply["promoted"])
        return total

    def pause(self, reason: str | None = None, *, group: str | None = None,
              by: str | None = None) -> dict[str, Any]:
        """Stop claims: workers get no job until :meth:`resume` (leases in flight carry on);
        with ``group``, only that fairness group's jobs wait. The owner stores the pause, so
        it outlasts an owner restart or HA failover; ``reason`` (why) and ``by`` (who; default
        this session's node id) show in ``stats()``. Returns the stored pause ``{at, by,
        reason, group}``. Raises :class:`ConfigError` (nothing sent) for a ``reason`` over 500
        bytes, a ``by`` over 200 or a bad ``group``, :class:`AdminDisabled` on a queue declared
        without ``admin=True``, :class:`StorageUnavailable` when the owner could not store it."""
        fields = pause_fields(reason=reason, by=by or self.node_id, group=group)
        reply = self._blocking(lambda: self._req.admin("pause", **fields), "pause")
        return dict(reply.get("pause") or {})

    async def apause(self, reason: str | None = None, *, group: str | None = None,
                     by: str | None = None) -> dict[str, Any]:
        """As :meth:`pause`, awaitable: the caller's loop runs while it waits."""
        fields = pause_fields(reason=reason, by=by or self.node_id, group=group)
        reply = await self._awaiting(lambda: self._req.admin("pause", **fields), "pause")
        return dict(reply.get("pause") or {})

    def resume(self, *, group: str | None = None) -> bool:
        """Let workers claim again after :meth:`pause` (the owner deletes the stored pause and
        nudges them); ``group``: lift only that group's pause. True if it was paused. Raises
        :class:`ConfigError` for a bad ``group``, :class:`AdminDisabled` on a queue declared
        without ``admin=True``."""
        fields = resume_fields(group=group)
        reply = self._blocking(lambda: self._req.admin("resume", **fields), "resume")
        return reply.get("was") is not None

    async def aresume(self, *, group: str | None = None) -> bool:
        """As :meth:`resume`, awaitable: the caller's loop runs while it waits."""
        fields = resume_fields(group=group)
        reply = await self._awaiting(lambda: self._req.admin("resume", **fields), "resume")
        return reply.get("was") is not None

    def cancel(self, job_id: str) -> str:
        """Cancel a job, as ``Istos.cancel``: "cancelled" (it was waiting), "cancelling" (its
        worker is told to stop it; it ends cancelled), "too_late" or "unknown". Raises
        :class:`AdminDisabled` on a queue declared without ``admin=True``."""
        return str(self._blocking(lambda: self._req.admin("cancel", job_id=str(job_id)),
                                  "cancel")["status"])

    async def acancel(self, job_id: str) -> str:
        """As :meth:`cancel`, awaitable: the caller's loop runs while it waits."""
        reply = await self._awaiting(lambda: self._req.admin("cancel", job_id=str(job_id)),
                                     "cancel")
        return str(reply["status"])

    def update(self, job_id: str, *, data: Any = UNSET, delay_s: float | None = None,
               run_at: float | datetime | None = None, priority: int | None = None) -> str:
        """Edit a waiting (ready or delayed) job in one durable write, as ``Istos.update``:
        its ``data`` (encoded with this LiveQueue's ``codecs``), its start (``delay_s`` from
        now, or ``run_at``, a datetime or epoch seconds) and/or its ``priority``. Returns the
        owner's status: ``"updated"``, ``"too_late"`` (it started already; nothing changed)
        or ``"unknown"``. Raises :class:`ConfigError` naming the field (nothing sent) for a
        bad ``job_id``, ``delay_s``, ``run_at`` or ``priority``, both ``delay_s`` and
        ``run_at``, or nothing to change; :class:`InvalidJob` for data that cannot be
        encoded or is over the size limit; :class:`StorageUnavailable` when the owner's
        write failed (the job stays as it was)."""
        fields = update_fields(self.queue, self._req.payload, job_id, data, delay_s, run_at,
                               priority)
        reply = self._blocking(lambda: self._req.ask("update", **fields), "update")
        return str(reply["status"])

    async def aupdate(self, job_id: str, *, data: Any = UNSET, delay_s: float | None = None,
                      run_at: float | datetime | None = None,
                      priority: int | None = None) -> str:
        """As :meth:`update`, awaitable: the caller's loop runs while it waits."""
        fields = update_fields(self.queue, self._req.payload, job_id, data, delay_s, run_at,
                               priority)
        reply = await self._awaiting(lambda: self._req.ask("update", **fields), "update")
        return str(reply["status"])

    # -- widgets, lifecycle --------------------------------------------------------------------
    def dashboard(self, refresh_s: float = 2.0) -> Any:
        """A :class:`~istos_nb.LiveDashboard` of this queue, refreshed every ``refresh_s``
        seconds (needs ipywidgets); see that class for what it shows and raises."""
        from ..views.widgets import LiveDashboard  # lazy: ipywidgets only for those who ask

        return LiveDashboard(self, refresh_s=refresh_s)

    def close(self) -> None:
        """Stop following, close the Zenoh session and the background loop. Idempotent, and
        never raises: a failure while closing is logged and the loop goes down regardless."""
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

    async def aclose(self) -> None:
        """As :meth:`close`, awaitable: the caller's loop runs while it closes."""
        await asyncio.to_thread(self.close)

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
        bound = min(self.timeout_s, 1.0)  # a repr must not hang a notebook for the full timeout
        try:
            s = self._blocking(lambda: self._req.ask("stats", bound), "stats",
                               bound + _SLACK_S)["stats"]
        except (IstosError, RuntimeError) as exc:
            return f"{head}, unavailable: {type(exc).__name__})"
        counts = " ".join(f"{k}={v}" for k, v in s.get("counts", {}).items())
        totals = s.get("totals", {})
        extra = " paused" if s.get("paused") else ""
        if self._stream is not None:
            extra += f" following({self._stream.counts['received']} received)"
        return (f"{head}, owner={s.get('node')!r}: {counts}; enqueued={totals.get('enqueued')} "
                f"acked={totals.get('acked')}{extra})")


def _check_batch_limit(limit: Any) -> int:
    """A batches page size: an int in [1, 1000]. Raises :class:`ConfigError`."""
    if type(limit) is not int or not 1 <= limit <= 1000:
        raise ConfigError(f"limit must be an integer in [1, 1000], got {limit!r}")
    return limit
