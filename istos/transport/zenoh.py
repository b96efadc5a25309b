"""The live Transport adapter: one Zenoh session per node.

Threading contract: Zenoh runs every callback on its own threads. Nothing here does engine work
on those threads; each callback converts the Zenoh object to plain ``str``/``bytes`` and hops
onto the asyncio loop that called :meth:`ZenohTransport.start` (``call_soon_threadsafe``, see
``_post``). Handlers the engine registers therefore always run on that loop.

Requests use the callback form of ``Session.get`` and resolve an asyncio future, so no thread is
parked per request: hundreds of queries can be in flight from one process (a blocking ``recv``
in ``asyncio.to_thread`` would cap that at the default executor's size, min(32, cpus + 4)
threads: 6 on 2 cores).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import types
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeAlias

import zenoh
from zenoh.handlers import Callback

from ..codec import MAX_MESSAGE_BYTES
from ..errors import ConfigError, MeshUnreachable
from ._linger import SWEEP_S, relax_zenoh_linger
from ._zenoh_config import RX_KEY, RX_MAX_MESSAGE_BYTES, rx_limit, to_zenoh_config
from .base import (
    LivelinessHandler,
    NoResponder,
    QueryHandler,
    SampleHandler,
    TransportError,
    TransportTimeout,
)

__all__ = ["ZenohTransport", "ZenohHandle", "ZenohConfigLike"]

log = logging.getLogger(__name__)

# Defined here, not in _zenoh_config: get_type_hints on ZenohTransport evaluates this string
# in this module's globals. The forms themselves are handled by _zenoh_config.
ZenohConfigLike: TypeAlias = "zenoh.Config | dict[str, Any] | str | os.PathLike[str] | None"
"""What ``ZenohTransport(config=...)`` accepts."""

# Zenoh's own query timeout is set a little past ours, so the asyncio timer normally decides
# and a late Zenoh "Timeout" error reply is never mistaken for a handler error.
_ZENOH_TIMEOUT_SLACK_S = 0.1
_PUBLISHERS_MAX = 256
_QUERIERS_MAX = 256
# Zenoh timeouts a declared querier may have (seconds, before the slack): see _Queriers.
_QUERIER_STEPS_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
_SEEN_KEYS_MAX = 4096
_rx_warned = False  # the missing-receive-limit warning is logged once per process


class ZenohHandle:
    """A declared queryable, subscriber, watch or token.

    ``close()`` undeclares it and is idempotent. Once it returns, the handler registered with
    the declaration is not called again, even for messages already on their way to the loop.
    """

    def __init__(self, owner: ZenohTransport, what: str) -> None:
        self._owner = owner
        self._entity: Any = None
        self._closed = False
        self.what = what

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._owner._handles.discard(self)
        entity, self._entity = self._entity, None
        try:
            if entity is not None:
                entity.undeclare()
        except zenoh.ZError as exc:
            # Undeclaring after the session closed is harmless: the session took it down.
            log.debug("undeclare %s: %s", self.what, exc)

    def __repr__(self) -> str:
        return f"<ZenohHandle {self.what}{' closed' if self._closed else ''}>"


class _PendingQuery:
    """One in-flight ``Session.get``: Zenoh-thread callbacks in, one asyncio future out.

    The future resolves with the first OK reply. Otherwise, when the get finishes: an error
    reply seen -> TransportError; nothing seen before the deadline -> NoResponder; the deadline
    passed -> TransportTimeout. Every decision is taken on the loop, in arrival order.
    """

    __slots__ = ("key", "fut", "deadline", "error", "timer", "_loop", "_owner")

    def __init__(self, owner: ZenohTransport, key: str, timeout_s: float) -> None:
        self._owner = owner
        self._loop = owner._require_loop()
        self.key = key
        self.fut: asyncio.Future[bytes] = self._loop.create_future()
        # The query's timeout is already in loop seconds (the caller converted it with its
        # Clock's to_loop_seconds), so the transport keeps it on the loop's timeline.
        self.deadline = self._loop.time() + timeout_s
        self.error: str | None = None
        self.timer = self._loop.call_later(timeout_s, self._expire)

    # -- Zenoh threads: convert, hop, return. Must stay tiny (indirect=False runs them inline).
    def on_reply(self, reply: zenoh.Reply) -> None:
        ok = reply.ok
        if ok is not None:
            self._owner._post(self._ok, ok.payload.to_bytes())
        else:
            err = reply.err
            text = err.payload.to_bytes().decode("utf-8", "replace") if err is not None else "?"
            self._owner._post(self._err, text)

    def on_done(self) -> None:
        # Once the future holds a reply, the final message changes nothing: skipping its hop
        # saves the loop a wake-up per request. (A benign cross-thread read: at worst the
        # hop is taken and _done finds the future resolved.)
        if not self.fut.done():
            self._owner._post(self._done)

    # -- loop thread
    def _ok(self, payload: bytes) -> None:
        if not self.fut.done():
            self.fut.set_result(payload)
            self._finish()

    def _err(self, text: str) -> None:
        if self.error is None:
            self.error = text

    def _done(self) -> None:
        if self.fut.done():
            return
        if self._loop.time() >= self.deadline:
            self._expire()
        elif self.error is not None:
            self._fail(TransportError(f"error reply to query on {self.key!r}: {self.error}"))
        else:
            self._fail(NoResponder(f"no queryable serves {self.key!r}"))

    def _expire(self) -> None:
        if self.fut.done():
            return
        if self.error is not None:
            self._fail(TransportError(f"error reply to query on {self.key!r}: {self.error}"))
        else:
            self._fail(TransportTimeout(f"no reply on {self.key!r} within the timeout"))

    def _fail(self, exc: BaseException) -> None:
        if not self.fut.done():
            self.fut.set_exception(exc)
        self._finish()

    def _finish(self) -> None:
        self.timer.cancel()
        self._owner._inflight.discard(self)


class _Publishers:
    """Publishers for keys put more than once; first puts go through ``Session.put``.

    A declared Publisher puts ~3x faster than ``Session.put`` here but costs ~8 us to declare,
    so only keys seen before are promoted. Both maps are bounded LRUs.
    """

    def __init__(self) -> None:
        self._pubs: OrderedDict[str, zenoh.Publisher] = OrderedDict()
        self._seen: OrderedDict[str, None] = OrderedDict()

    def put(self, session: zenoh.Session, key: str, payload: bytes) -> None:
        pub = self._pubs.get(key)
        if pub is not None:
            self._pubs.move_to_end(key)
            pub.put(payload)
            return
        if key not in self._seen:
            self._seen[key] = None
            if len(self._seen) > _SEEN_KEYS_MAX:
                self._seen.popitem(last=False)
            session.put(key, payload)
            return
        pub = session.declare_publisher(key)
        self._pubs[key] = pub
        if len(self._pubs) > _PUBLISHERS_MAX:
            _, old = self._pubs.popitem(last=False)
            old.undeclare()
        pub.put(payload)

    def close(self) -> None:
        pubs = list(self._pubs.values())
        self._pubs.clear()
        self._seen.clear()
        for pub in pubs:
            try:
                pub.undeclare()
            except zenoh.ZError:
                pass


class _Queriers:
    """Declared queriers for keys queried more than once; a first query goes through
    ``Session.get``.

    A Querier's ``get`` skips the per-call key expression and options work of
    ``Session.get`` (about 10 us of its ~60 us here: ``bench.client_path``). Its Zenoh
    timeout is fixed when it is declared, so each key gets one querier per step of
    :data:`_QUERIER_STEPS_S` used: a call takes the smallest step at or above its own timeout
    (Zenoh's timeout then stays past the call's, as with ``Session.get``, and the asyncio
    timer decides); a call longer than the last step uses ``Session.get``. Both maps are
    bounded LRUs.
    """

    def __init__(self) -> None:
        self._queriers: OrderedDict[tuple[str, float], zenoh.Querier] = OrderedDict()
        self._seen: OrderedDict[str, None] = OrderedDict()

    def get(self, session: zenoh.Session, key: str, callback: Callback[zenoh.Reply],
            payload: bytes, timeout_s: float, express: bool) -> None:
        step = next((s for s in _QUERIER_STEPS_S if s >= timeout_s), None)
        if step is None or key not in self._seen:
            if step is not None:
                self._seen[key] = None
                if len(self._seen) > _SEEN_KEYS_MAX:
                    self._seen.popitem(last=False)
            session.get(key, callback, payload=payload,
                        timeout=timeout_s + _ZENOH_TIMEOUT_SLACK_S,
                        consolidation=zenoh.ConsolidationMode.NONE,  # replies as they arrive
                        express=express)
            return
        self._seen.move_to_end(key)
        querier = self._queriers.get((key, step))
        if querier is None:
            querier = session.declare_querier(
                key, timeout=step + _ZENOH_TIMEOUT_SLACK_S,
                consolidation=zenoh.ConsolidationMode.NONE, express=express)
            self._queriers[(key, step)] = querier
            if len(self._queriers) > _QUERIERS_MAX:
                _, old = self._queriers.popitem(last=False)
                _undeclare(old)
        else:
            self._queriers.move_to_end((key, step))
        querier.get(callback, payload=payload)

    def close(self) -> None:
        queriers = list(self._queriers.values())
        self._queriers.clear()
        self._seen.clear()
        for querier in queriers:
            _undeclare(querier)


def _undeclare(entity: Any) -> None:
    try:
        entity.undeclare()
    except zenoh.ZError:
        pass


class ZenohTransport:
    """:class:`istos.transport.base.Transport` over one Zenoh session.

    ``config`` is None (Zenoh defaults: peer mode, multicast scouting), a ``zenoh.Config``, a
    dict (Zenoh's JSON5 schema as Python data), a JSON5 document as a string (any string with a
    ``{``), or a path to a JSON5 file. A config Zenoh rejects raises
    :class:`~istos.errors.ConfigError` here, or from :meth:`start` when only opening the
    session reveals it (bad or busy endpoint).
    """

    #: Zenoh's ``express`` on queries and replies (sent at once, never batched). Off by
    #: default: measured here it did not shorten our round trip, and Zenoh documents a
    #: throughput cost (bench/remote_enqueue.py, bench/README.md). Settable per instance.
    express: bool = False

    #: Queries to a key asked before go through a declared Zenoh Querier (``_Queriers``)
    #: rather than ``Session.get``: the same query, cheaper to send. A class attribute, settable
    #: per instance (``bench.client_path`` compares the two in one run).
    use_queriers: bool = True

    def __init__(self, config: ZenohConfigLike = None, *, node_id: str) -> None:
        self.node_id = node_id
        self._config = to_zenoh_config(config)
        self._session: zenoh.Session | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._handles: set[ZenohHandle] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._inflight: set[_PendingQuery] = set()
        self._publishers = _Publishers()
        self._queriers = _Queriers()
        self._inbox: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = deque()
        self._drain_scheduled = False
        self._linger_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Open the session (in a thread: the first peer on a host takes ~0.5 s).

        From then on, until :meth:`close`, the TCP links Zenoh opens are made not to linger
        on close (see :mod:`._linger`: a vanished peer otherwise stalls the session's receive
        threads for 10 s). Raises ConfigError when Zenoh cannot open a session with the
        config, TransportError when called after :meth:`close`. A second call while open
        does nothing.
        """
        if self._closed:
            raise TransportError(f"transport of node {self.node_id!r} is closed")
        if self._session is not None:
            return
        self._loop = asyncio.get_running_loop()
        try:
            self._session = await asyncio.to_thread(zenoh.open, self._config)
        except zenoh.ZError as exc:
            if "unable to connect" in str(exc).lower():
                raise MeshUnreachable(
                    f"node {self.node_id!r} reached no Zenoh router at its connect endpoints "
                    f"({exc}): is a router listening there, and, with TLS, does it accept "
                    "this node's certificate (connect_certificate / connect_private_key, "
                    "signed by the router's root CA)?") from exc
            raise ConfigError(f"zenoh could not open a session with this config: {exc}") from exc
        self._linger_task = self._loop.create_task(self._relax_linger())

    async def _relax_linger(self) -> None:
        while True:
            relax_zenoh_linger()
            # The live transport's own housekeeping on the loop (never simulated: the simulator
            # runs transport/local.py), so the loop's time, not a node's Clock.
            await asyncio.sleep(SWEEP_S)

    async def close(self) -> None:
        """Undeclare everything, fail in-flight queries, close the session. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._linger_task is not None:
            self._linger_task.cancel()
        for handle in list(self._handles):
            handle.close()
        # Serving tasks reply_err and drop their queries when cancelled (see _answer).
        me = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not me]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        for pending in list(self._inflight):
            pending._fail(TransportError(f"transport of node {self.node_id!r} closed"))
        self._publishers.close()
        self._queriers.close()
        session, self._session = self._session, None
        if session is not None:
            await asyncio.to_thread(session.close)

    def kill(self) -> None:
        """Nothing: a Zenoh session dies with its process (see ``Transport.kill``)."""

    def peer_ids(self) -> list[str]:
        """Zenoh ids of the peers this session is connected to (for diagnostics and tests)."""
        return sorted(str(z) for z in self._require_session().info.peers_zid())

    # ------------------------------------------------------------------ request / reply
    async def declare_queryable(self, key: str, handler: QueryHandler) -> ZenohHandle:
        """Serve ``key``: each query runs ``handler(key, payload)`` as a task on the loop.

        Its result is the reply; if it raises, the querier gets an error reply (and a
        TransportError). The query is dropped after replying so Zenoh can finalise it.
        """
        session = self._require_session()
        self._warn_rx_limit()

        def declare(handle: ZenohHandle) -> Any:
            def on_query(query: zenoh.Query) -> None:  # Zenoh thread
                self._post(self._serve, handle, query, key, handler)

            return session.declare_queryable(key, Callback(on_query))

        return self._open_handle(f"queryable {key}", declare)

    def _warn_rx_limit(self) -> None:
        """Only owners declare queryables: one that lets Zenoh reassemble messages far above
        the frame cap holds each in memory before refusing it (docs/security/README.md)."""
        global _rx_warned
        limit = rx_limit(self._config)
        if _rx_warned or (limit is not None and limit <= RX_MAX_MESSAGE_BYTES):
            return
        _rx_warned = True
        log.warning("node %s serves requests with a zenoh config whose receive limit is %s "
                    "bytes; Istos frames are at most %d: set %s to %d so larger messages are "
                    "dropped before they land in memory (docs/security/README.md)",
                    self.node_id, "unknown" if limit is None else limit,
                    MAX_MESSAGE_BYTES, RX_KEY.replace("/", "."),
                    RX_MAX_MESSAGE_BYTES)

    def _serve(
        self, handle: ZenohHandle, query: zenoh.Query, declared: str, handler: QueryHandler
    ) -> None:
        if handle.closed:
            _drop(query)
            return
        task = _start_eagerly(self._require_loop(), self._answer(query, declared, handler))
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _answer(self, query: zenoh.Query, declared: str, handler: QueryHandler) -> None:
        key = str(query.key_expr)
        # A query may carry wildcards; replies must go out on a concrete key.
        reply_key = key if "*" not in key else declared
        payload = query.payload
        try:
            result = await handler(key, payload.to_bytes() if payload is not None else b"")
        except asyncio.CancelledError:
            _reply_err(query, key, "transport closing")
            _drop(query)
            raise
        except Exception as exc:
            log.exception("query handler on %r failed", key)
            _reply_err(query, key, f"{type(exc).__name__}: {exc}")
        else:
            try:
                query.reply(reply_key, result, express=self.express)
            except Exception as exc:  # closed session, or a result that is not bytes
                log.warning("could not reply to query on %r: %s", key, exc)
                _reply_err(query, key, f"reply failed: {exc}")
        _drop(query)

    async def query(self, key: str, payload: bytes, timeout_s: float) -> bytes:
        """Send ``payload`` to the queryable serving ``key``; return its first OK reply.

        Raises NoResponder when the query completed before ``timeout_s`` with no reply,
        TransportTimeout when ``timeout_s`` elapsed first, TransportError on an error reply.
        """
        session = self._require_session()
        pending = _PendingQuery(self, key, timeout_s)
        self._inflight.add(pending)
        # indirect=False: run inline on Zenoh's thread instead of spawning a Python thread
        # per get (measured 11k vs 4.4k gets/s); the callbacks only hop.
        callback = Callback(pending.on_reply, pending.on_done, indirect=False)
        try:
            if self.use_queriers:
                self._queriers.get(session, key, callback, payload, timeout_s, self.express)
            else:
                session.get(key, callback, payload=payload,
                            timeout=timeout_s + _ZENOH_TIMEOUT_SLACK_S,
                            consolidation=zenoh.ConsolidationMode.NONE,  # replies as they come
                            express=self.express)
        except zenoh.ZError as exc:
            pending._fail(TransportError(f"query on {key!r} failed: {exc}"))
        return await pending.fut

    # ------------------------------------------------------------------ pub / sub
    async def put(self, key: str, payload: bytes) -> None:
        """Publish to every matching subscriber. Does not block: Zenoh drops under congestion."""
        session = self._require_session()
        try:
            self._publishers.put(session, key, payload)
        except zenoh.ZError as exc:
            raise TransportError(f"put on {key!r} failed: {exc}") from exc

    async def declare_subscriber(self, key_expr: str, handler: SampleHandler) -> ZenohHandle:
        """Call ``handler(key, payload)`` on the loop for every sample matching ``key_expr``."""
        session = self._require_session()

        def declare(handle: ZenohHandle) -> Any:
            def on_sample(sample: zenoh.Sample) -> None:  # Zenoh thread
                key, payload = str(sample.key_expr), sample.payload.to_bytes()
                self._post(self._deliver, handle, handler, key, payload)

            return session.declare_subscriber(key_expr, Callback(on_sample))

        return self._open_handle(f"subscriber {key_expr}", declare)

    # ------------------------------------------------------------------ liveliness
    async def declare_liveliness_token(self, key: str) -> ZenohHandle:
        """Announce presence at ``key`` until the handle is closed or the session ends."""
        session = self._require_session()
        return self._open_handle(
            f"liveliness token {key}", lambda _: session.liveliness().declare_token(key)
        )

    async def watch_liveliness(self, key_expr: str, handler: LivelinessHandler) -> ZenohHandle:
        """Call ``handler(key, alive)`` on the loop: tokens alive now first, then changes.

        A token drops (alive=False) when its handle is closed or its session ends or is lost.
        """
        session = self._require_session()

        def declare(handle: ZenohHandle) -> Any:
            def on_sample(sample: zenoh.Sample) -> None:  # Zenoh thread
                alive = sample.kind == zenoh.SampleKind.PUT
                self._post(self._deliver, handle, handler, str(sample.key_expr), alive)

            liveliness = session.liveliness()
            return liveliness.declare_subscriber(key_expr, Callback(on_sample), history=True)

        return self._open_handle(f"liveliness watch {key_expr}", declare)

    async def liveliness_alive(self, key_expr: str, timeout_s: float = 1.0) -> list[str]:
        """Sorted keys of live tokens matching ``key_expr``: what answered within ``timeout_s``."""
        session = self._require_session()
        loop = self._require_loop()
        keys: set[str] = set()
        done: asyncio.Future[None] = loop.create_future()

        def finish() -> None:
            if not done.done():
                done.set_result(None)

        def on_reply(reply: zenoh.Reply) -> None:  # Zenoh thread
            ok = reply.ok
            if ok is not None:
                self._post(keys.add, str(ok.key_expr))

        timer = loop.call_later(timeout_s, finish)
        try:
            session.liveliness().get(
                key_expr,
                Callback(on_reply, lambda: self._post(finish), indirect=False),
                timeout=timeout_s,
            )
            await done
        except zenoh.ZError as exc:
            raise TransportError(f"liveliness query on {key_expr!r} failed: {exc}") from exc
        finally:
            timer.cancel()
        return sorted(keys)

    # ------------------------------------------------------------------ plumbing
    def _post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the loop soon; callable from any thread, never blocks.

        Calls are queued in one inbox and a single wake-up drains whatever has piled up, so a
        burst costs one ``call_soon_threadsafe`` (a self-pipe write) instead of one per
        message: 2.4x the subscriber throughput measured here. Order of arrival is kept.
        """
        loop = self._loop
        if loop is None:
            return
        self._inbox.append((fn, args))
        if not self._drain_scheduled:
            self._drain_scheduled = True
            try:
                loop.call_soon_threadsafe(self._drain)
            except RuntimeError:
                pass  # the loop is closed: the process is shutting down, nobody to tell

    def _drain(self) -> None:
        # Clear the flag before popping: anything appended from now on schedules a new drain.
        # Only the calls present now run, so a flood cannot starve the rest of the loop.
        self._drain_scheduled = False
        inbox = self._inbox
        for _ in range(len(inbox)):
            fn, args = inbox.popleft()
            try:
                fn(*args)
            except Exception:
                log.exception("transport callback %r failed", fn)

    def _deliver(
        self, handle: ZenohHandle, handler: Callable[[str, Any], None], key: str, value: Any
    ) -> None:
        if handle.closed:
            return
        try:
            handler(key, value)
        except Exception:
            log.exception("%s: handler failed on %r", handle.what, key)

    def _open_handle(self, what: str, declare: Callable[[ZenohHandle], Any]) -> ZenohHandle:
        handle = ZenohHandle(self, what)
        try:
            handle._entity = declare(handle)
        except zenoh.ZError as exc:
            raise TransportError(f"could not declare {what}: {exc}") from exc
        self._handles.add(handle)
        return handle

    def _require_session(self) -> zenoh.Session:
        if self._session is None:
            state = "closed" if self._closed else "not started"
            raise TransportError(f"transport of node {self.node_id!r} is {state}")
        return self._session

    def _require_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise TransportError(f"transport of node {self.node_id!r} is not started")
        return self._loop

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._session else "new")
        return f"<ZenohTransport node={self.node_id!r} {state}>"


def _drop(query: zenoh.Query) -> None:
    """Finalise a query so the querier's get completes; tolerate a closed session."""
    try:
        query.drop()
    except Exception as exc:  # already dropped, or the session is gone
        log.debug("query drop: %s", exc)


def _reply_err(query: zenoh.Query, key: str, text: str) -> None:
    try:
        query.reply_err(text.encode())
    except Exception as exc:
        log.debug("could not send error reply on %r: %s", key, exc)


def _start_eagerly(loop: asyncio.AbstractEventLoop,
                   coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Run ``coro`` now, up to its first suspension: a request the owner answers without
    waiting (an in-memory enqueue, claim or ack) is answered in this loop turn, without the
    extra loop iteration a new Task's first step costs (about 50 us of a remote enqueue's
    round trip here, ``bench.remote_enqueue``). Returns the Task that runs the rest, or None
    when the coroutine already finished.

    Python >= 3.12 does this itself (``eager_start``, with the Task current while it runs).
    Before that the first step runs outside any Task, like the loop callback calling it; the
    handlers served here need no current Task there (a storage adapter's deadline then takes
    ``asyncio.wait_for``, which makes its own Task, rather than ``asyncio.timeout``). Called
    while a Task runs, the coroutine gets a Task of its own instead: its first step must never
    run in another Task's name (an ``asyncio.timeout`` in it would cancel that Task).
    """
    if _EAGER_START:
        task: asyncio.Task[None] = asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg]
        return None if task.done() else task
    if asyncio.current_task(loop) is not None:
        return loop.create_task(coro)
    try:
        pending = coro.send(None)
    except StopIteration:
        return None
    return loop.create_task(_resume(coro, pending))


_EAGER_START = sys.version_info >= (3, 12)


@types.coroutine
def _resume(coro: Coroutine[Any, Any, None], pending: Any) -> Generator[Any, None, None]:
    """Drive a coroutine that ran eagerly to its first suspension: hand the Task the future
    it waits on, then pass each wake-up (or cancellation) on to it."""
    while True:
        try:
            yield pending
        except BaseException as exc:  # the Task was cancelled: the coroutine sees it
            try:
                pending = coro.throw(exc)
            except StopIteration:
                return
        else:
            try:
                pending = coro.send(None)
            except StopIteration:
                return
