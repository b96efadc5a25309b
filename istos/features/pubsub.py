"""Publish/subscribe over the mesh, optionally durable (``app.publish``, ``app.subscribe``).

An event is not a job: every live subscriber gets every event (fan-out), nobody acks, nothing is
retried. Reach for a work queue when exactly one worker must do something.

Plain events, ``await app.publish(key, data)``
    One message on ``{prefix}/ev/{key}``. Every subscriber of ``key`` declared by any app of the
    mesh at that moment receives it, at most once, in the order its publisher sent (the transport
    keeps per-publisher order). A subscriber that is down misses it for good.

Durable events, ``await app.publish(key, data, durable=True)``
    The publisher first appends the event to a history in its storage (namespace
    ``events:{key}``, keys zero-padded sequence numbers) and only then sends it with its number.
    Numbers are allocated with ``put_if_absent`` on the next key, so publishers sharing a storage
    never share a number (see :mod:`istos.features.evhistory`). The history keeps the newest
    ``history_limit`` events and ignores (and gradually deletes) those older than
    ``history_ttl_s``.

    A durable subscriber, ``@app.subscribe(key, durable=True, name=...)``, keeps its cursor (the
    last number it processed) in storage: namespace ``evcursor``, key ``{key}|{name}``. On start
    it declares its live subscription, then reads the history from cursor+1 (a name with no
    cursor starts at the oldest retained event: late joiners catch up), then takes live events.
    It delivers in sequence order: a live event already processed is dropped, a gap is filled
    from the history first, and every ``poll_interval_s`` it looks for events whose live message
    was lost. **At-least-once** per retained event: the cursor is written after the function
    returns, so a crash in between delivers that event again after a restart. Events that left
    the history while the subscriber was away (count or age) are skipped.

    Durable publishers and subscribers of a key must share storage (Redis, SQL, or one
    MemoryStorage object in a simulation). A name is one subscriber identity, meant to run in one
    process at a time; for competing consumers use a work queue.

Subscriber functions, ``fn(data)`` or ``fn(data, meta)`` (a parameter named ``meta`` receives an
:class:`EventMeta`), run one event at a time per subscription: async ones on the loop, plain ones
in a thread (inline when the node runs sync code inline, as the simulator does). An exception is
logged and the event counts as processed.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .. import codec
from ..cancel_guard import within
from ..core.config import check_queue_name
from ..errors import ConfigError, InvalidJob, IstosError, ProtocolError
from .evhistory import HEAD_NS as HEAD_NS  # re-exported: it was defined here
from .evhistory import History, _decode_event, _Event

if TYPE_CHECKING:
    from ..node import Node
    from ..transport.base import Handle

log = logging.getLogger("istos.features.pubsub")
F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_HISTORY_LIMIT = 10_000
DEFAULT_HISTORY_TTL_S = 86_400.0
CURSOR_NS = "evcursor"
_MAX_PENDING = 10_000  # per subscription; overflow is dropped (durable events return via history)
_MAX_STORED_KEY = 255  # the SQL adapter's key column


@dataclass(frozen=True, slots=True)
class EventMeta:
    """What a subscriber may learn besides the data: the key, the durable sequence number (None
    for a plain event) and the publisher's clock reading when it published."""

    key: str
    seq: int | None
    published_at: float


@dataclass(frozen=True, slots=True)
class Subscription:
    """A declared ``@app.subscribe``; ``name`` identifies a durable subscriber's cursor."""

    key: str
    fn: Callable[..., Any]
    durable: bool
    name: str
    poll_interval_s: float
    wants_meta: bool
    is_async: bool


def check_event_key(key: object) -> str:
    """Event keys become Zenoh key expressions (queue-name rules) and storage keys."""
    try:
        check_queue_name(key)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("queue name", "event key", 1)) from None
    assert isinstance(key, str)
    if "|" in key or len(key) > 200:
        raise ConfigError(f"event key {key[:40]!r} must be at most 200 characters without '|'")
    return key


def _positive(option: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{option} must be a finite number > 0, got {value!r}")
    return float(value)


class _Subscriber:
    """One subscription running on one app: its transport handle, inbox and consumer task."""

    def __init__(self, sub: Subscription, node: Node, history: History) -> None:
        self.sub = sub
        self.node = node
        self.history = history
        self.cursor = 0  # durable: the last number processed (or skipped as gone)
        self.dropped = 0
        self._loaded = False
        self._stopping = False
        self._inbox: asyncio.Queue[bytes] = asyncio.Queue(_MAX_PENDING)
        self._handle: Handle | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        transport = self.node.transport
        assert transport is not None  # plugins start after the transport
        # Live first, history second: an event published in between is then in both, and the
        # sequence check drops the copy, where the other order could miss it.
        self._handle = await transport.declare_subscriber(
            f"{self.node.prefix}/ev/{self.sub.key}", self._on_sample)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        # The flag as well as the cancel: on Python 3.10 the deadline in _next (wait_for there)
        # swallows a cancellation that lands as the queue hands over an item, and the loop
        # would go on.
        self._stopping = True
        if self._handle is not None:
            self._handle.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def _on_sample(self, key: str, payload: bytes) -> None:
        try:
            self._inbox.put_nowait(payload)
        except asyncio.QueueFull:
            self.dropped += 1
            if self.dropped % 1000 == 1:
                log.warning("subscriber %s on %r is behind: %d events dropped so far",
                            self.sub.name, self.sub.key, self.dropped)

    async def _run(self) -> None:
        if self.sub.durable:
            await self._guarded(self._catch_up(None))
        while not self._stopping:
            raw = await self._next()
            if raw is None:  # poll interval passed: look for events whose message was lost
                await self._guarded(self._catch_up(None))
                continue
            try:
                event = _decode_event(raw)
            except ProtocolError as exc:
                log.warning("subscriber %s on %r: dropped message: %s",
                            self.sub.name, self.sub.key, exc)
                continue
            await self._guarded(self._on_live(event))

    async def _next(self) -> bytes | None:
        if not self.sub.durable:
            return await self._inbox.get()
        wait_s = self.node.clock.to_loop_seconds(self.sub.poll_interval_s)
        try:
            return await within(self._inbox.get(), wait_s)
        except asyncio.TimeoutError:
            return None

    async def _guarded(self, step: Any) -> None:
        # A storage outage must not end the subscription: the next event or poll retries.
        try:
            await step
        except IstosError as exc:
            log.warning("subscriber %s on %r: %s", self.sub.name, self.sub.key, exc)

    async def _on_live(self, event: _Event) -> None:
        if not self.sub.durable or event.seq is None:
            await self._call(event)
            return
        if not self._loaded or event.seq > self.cursor + 1:
            await self._catch_up(event.seq - 1)
        if event.seq > self.cursor:
            await self._process(event)

    async def _catch_up(self, upto: int | None) -> None:
        """Deliver retained events after the cursor, through ``upto`` (None: to the newest)."""
        if not self._loaded:
            raw = await self.node.storage.get(CURSOR_NS, self._cursor_key)
            try:
                self.cursor = int(raw) if raw else 0
            except ValueError:
                log.warning("subscriber %s on %r: unreadable cursor %r, starting over",
                            self.sub.name, self.sub.key, raw)
            self._loaded = True
        head = await self.history.head(self.sub.key)
        if head is None:  # nothing retained in this storage: a live gap cannot be filled
            self.cursor = max(self.cursor, upto or 0)
            return
        newest, oldest = head
        end = newest if upto is None else upto
        seq = max(self.cursor + 1, oldest)
        while upto is None or seq <= upto:
            try:
                event = await self.history.read(self.sub.key, seq)
            except ProtocolError as exc:  # skip it rather than stall on it forever
                log.warning("subscriber %s on %r: skipped stored event %d: %s",
                            self.sub.name, self.sub.key, seq, exc)
            else:
                if event is None and seq > end:
                    break  # past the newest: done
                # A missing number at or below the newest was trimmed: skip it, as expired ones.
                if event is not None and (event.expires_at is None
                                          or event.expires_at > self.node.clock.now()):
                    await self._process(event)
            self.cursor = max(self.cursor, seq)
            seq += 1

    @property
    def _cursor_key(self) -> str:
        return f"{self.sub.key}|{self.sub.name}"

    async def _process(self, event: _Event) -> None:
        assert event.seq is not None
        await self._call(event)
        self.cursor = event.seq
        await self.node.storage.put(CURSOR_NS, self._cursor_key, str(event.seq).encode())

    async def _call(self, event: _Event) -> None:
        sub = self.sub
        try:
            data = self.node.payload.decode_body(event.body)  # the app's payload codecs
        except Exception as exc:  # msgpack raises several unrelated types
            log.warning("subscriber %s on %r: undecodable event: %s", sub.name, sub.key, exc)
            return
        kwargs = {"meta": EventMeta(sub.key, event.seq, event.published_at)} \
            if sub.wants_meta else {}
        try:
            if sub.is_async:
                await sub.fn(data, **kwargs)
            else:
                await (self.node.run_sync or _on_default_executor)(
                    functools.partial(sub.fn, data, **kwargs))
        except Exception:
            log.exception("subscriber %s on %r failed on event seq=%s",
                          sub.name, sub.key, event.seq)


async def _on_default_executor(call: Callable[[], Any]) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, call)


class _PubSubPlugin:
    """Starts the app's subscriptions when it serves and stops them when it stops."""

    def __init__(self, history: History) -> None:
        self.history = history
        self.subscriptions: list[Subscription] = []
        self.running: list[_Subscriber] = []

    async def start(self, app: Any) -> None:
        for sub in self.subscriptions:
            runner = _Subscriber(sub, app.node, self.history)
            self.running.append(runner)
            await runner.start()

    async def stop(self, app: Any) -> None:
        running, self.running = self.running, []
        await asyncio.gather(*(r.stop() for r in running))


def _wants_meta(fn: Callable[..., Any]) -> bool:
    try:
        return "meta" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # some builtins have no signature
        return False


class PubSub:
    """``subscribe`` and ``publish`` of one app (``app.pubsub``; see the module docstring).

    Runs on the app's node; its subscribers start and stop with the app as a plugin
    (``add_plugin``), registered with the first subscription declared. ``serving`` and
    ``require_serving`` are the app's own checks.
    """

    def __init__(self, node: Node, *, add_plugin: Callable[[Any], None],
                 serving: Callable[[], bool], require_serving: Callable[[], None]) -> None:
        self.node = node
        self.history = History(node.storage)
        self.plugin: _PubSubPlugin | None = None
        self.durable_names: set[tuple[str, str]] = set()
        self._add_plugin = add_plugin
        self._serving = serving
        self._require_serving = require_serving

    @property
    def subscriptions(self) -> list[Subscription]:
        """The subscriptions declared on this app."""
        plugin = self.plugin
        return [] if plugin is None else list(plugin.subscriptions)

    def subscribe(self, key: str, *, durable: bool = False, name: str | None = None,
                  poll_interval_s: float = 5.0) -> Callable[[F], F]:
        """Decorate ``fn(data)`` or ``fn(data, meta)`` to receive every event published on ``key``.

        ``durable``: catch up from the history after downtime (see the module docstring);
        ``name`` identifies the durable cursor (default: the function's module-qualified name)
        and ``poll_interval_s`` is how often it checks the history for events it missed live.
        Declare before the app serves. Raises :class:`ConfigError` for a bad key or option, a
        name used twice on one key, or a declaration while serving.
        """
        check_event_key(key)
        poll = _positive("poll_interval_s", poll_interval_s)
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigError(f"subscriber name must be a non-empty string, got {name!r}")

        def register(fn: F) -> F:
            if not callable(fn):
                raise ConfigError(f"@app.subscribe({key!r}) must decorate a function")
            if self._serving():
                raise ConfigError(f"@app.subscribe({key!r}) after the app started serving; "
                                  "declare subscriptions before serving()")
            label = name or f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
            if durable:
                if len(key) + 1 + len(label) > _MAX_STORED_KEY:
                    raise ConfigError(f"durable subscriber name {label[:40]!r}... is too long "
                                      f"for key {key!r}; pass a shorter name=")
                if (key, label) in self.durable_names:
                    raise ConfigError(f"durable subscriber {label!r} on {key!r} is declared "
                                      "twice; give each a distinct name=")
                self.durable_names.add((key, label))
            if self.plugin is None:
                self.plugin = _PubSubPlugin(self.history)
                self._add_plugin(self.plugin)
            self.plugin.subscriptions.append(Subscription(
                key, fn, bool(durable), label, poll, _wants_meta(fn),
                inspect.iscoroutinefunction(fn)))
            return fn

        return register

    async def publish(self, key: str, data: Any, *, durable: bool = False,
                      history_limit: int = DEFAULT_HISTORY_LIMIT,
                      history_ttl_s: float = DEFAULT_HISTORY_TTL_S) -> int | None:
        """Send ``data`` to every subscriber of ``key`` on the mesh; the number if ``durable``.

        Durable: stored in the history (keeping the newest ``history_limit`` events, for at most
        ``history_ttl_s``) *before* it is sent, so a storage failure raises
        :class:`~istos.errors.StorageUnavailable` with nothing sent, and a send failure after it
        leaves the event for durable subscribers to find. Raises :class:`InvalidJob` (nothing
        sent) for data msgpack cannot encode, :class:`ConfigError` for a bad key or option and
        :class:`IstosError` when the app is not serving.
        """
        check_event_key(key)
        try:
            body = self.node.payload.encode_body(data, queue=key)  # the app's payload codecs
        except InvalidJob as exc:
            raise InvalidJob(f"event data for {key!r} rejected: {exc}") from exc
        if durable and (isinstance(history_limit, bool) or not isinstance(history_limit, int)
                        or history_limit < 1):
            raise ConfigError(f"history_limit must be an integer >= 1, got {history_limit!r}")
        ttl = _positive("history_ttl_s", history_ttl_s)
        self._require_serving()
        node = self.node
        now = node.clock.now()
        msg: dict[str, Any] = {"v": codec.PROTOCOL_VERSION, "pub": node.node_id, "t": now,
                               "body": body}
        seq = None
        if durable:
            record = codec.encode_message({**msg, "exp": now + ttl})
            seq = await self.history.append(key, record, now=now, limit=history_limit)
            msg["seq"] = seq
        assert node.transport is not None  # serving
        await node.transport.put(f"{node.prefix}/ev/{key}", codec.encode_message(msg))
        return seq
