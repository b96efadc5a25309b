"""The in-process mesh: every node of one process (or one simulation) on a shared registry.

With no network model, messages are delivered on the next loop turn, reliably: a first-class
transport for running several Istos apps in one process (tests, notebooks). The simulator supplies
a :class:`NetworkModel` that adds latency, loss and partitions, all drawn from its seed; delivery
then happens on the event loop's (virtual) timeline.

Each node's transport captures the ``contextvars`` context it was started in and runs its
handlers there, so tasks spawned on behalf of a node belong to that node (the simulator cancels
them all when the node crashes).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .base import (
    LivelinessHandler,
    NoResponder,
    QueryHandler,
    SampleHandler,
    TransportError,
    TransportTimeout,
    key_matches,
)

# Every query and put matches its key against each registration; the same few pairs recur for
# the whole run (a queue's rpc, nudge, result keys), so the answers are cached.
_matches = functools.lru_cache(maxsize=4096)(key_matches)


class NetworkModel(Protocol):
    def delay(self, src: str, dst: str) -> float | None:
        """Seconds a message from ``src`` to ``dst`` takes, or None if it is lost."""

    def reachable(self, src: str, dst: str) -> bool:
        """Whether ``src`` and ``dst`` can talk at all now (partitions)."""


class _Reliable:
    def delay(self, src: str, dst: str) -> float | None:
        return 0.0

    def reachable(self, src: str, dst: str) -> bool:
        return True


@dataclass(eq=False)
class _Entry:
    key: str
    node: LocalTransport
    callback: Any
    closed: bool = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.node.mesh._remove(self)


class LocalMesh:
    """The registry shared by the nodes of one mesh."""

    def __init__(self, network: NetworkModel | None = None) -> None:
        self.network: NetworkModel = network or _Reliable()
        self.nodes: dict[str, LocalTransport] = {}
        self._queryables: list[_Entry] = []
        self._subscribers: list[_Entry] = []
        self._tokens: list[_Entry] = []
        self._watchers: list[_Entry] = []
        # Watcher entry -> token keys it has been told are alive. Keyed by the entry itself
        # (identity, eq=False), never id(): a dead watcher's id is reused by new objects.
        self._visible: dict[_Entry, set[str]] = {}

    def transport(self, node_id: str) -> LocalTransport:
        return LocalTransport(self, node_id)

    # -- registry --
    def _remove(self, entry: _Entry) -> None:
        for bucket in (self._queryables, self._subscribers, self._tokens, self._watchers):
            if entry in bucket:
                bucket.remove(entry)
        self._visible.pop(entry, None)
        self.refresh_liveliness()

    def refresh_liveliness(self) -> None:
        """Re-evaluate which tokens each watcher sees (after a token change or a partition)."""
        net = self.network
        for watcher in list(self._watchers):
            seen = self._visible.setdefault(watcher, set())
            now_alive = {t.key for t in self._tokens
                         if key_matches(watcher.key, t.key) and t.node.alive
                         and (t.node is watcher.node
                              or net.reachable(t.node.node_id, watcher.node.node_id))}
            for key in sorted(now_alive - seen):
                watcher.node._deliver_call(watcher.callback, key, True)
            for key in sorted(seen - now_alive):
                watcher.node._deliver_call(watcher.callback, key, False)
            self._visible[watcher] = now_alive


class LocalTransport:
    def __init__(self, mesh: LocalMesh, node_id: str) -> None:
        self.mesh = mesh
        self.node_id = node_id
        self.alive = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._context: contextvars.Context | None = None
        self._entries: list[_Entry] = []
        self._tasks: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._context = contextvars.copy_context()
        self.alive = True
        self.mesh.nodes[self.node_id] = self

    async def close(self) -> None:
        self._shutdown(kill=False)

    def kill(self) -> None:
        """Vanish at once: registrations gone, in-flight handler tasks cancelled."""
        self._shutdown(kill=True)

    def _shutdown(self, *, kill: bool) -> None:
        self.alive = False
        for entry in list(self._entries):
            entry.close()
        self._entries.clear()
        if kill:
            for task in list(self._tasks):
                task.cancel()
        if self.mesh.nodes.get(self.node_id) is self:
            del self.mesh.nodes[self.node_id]
        self.mesh.refresh_liveliness()

    def _register(self, bucket: list[_Entry], key: str, callback: Any) -> _Entry:
        if not self.alive:
            raise TransportError(f"transport of node {self.node_id!r} is not started")
        entry = _Entry(key, self, callback)
        bucket.append(entry)
        self._entries.append(entry)
        return entry

    # -- delivery helpers --
    def _loop_or_fail(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise TransportError(f"transport of node {self.node_id!r} is not started")
        return self._loop

    def _deliver_call(self, fn: Callable[..., Any], *args: Any,
                      delay: float = 0.0) -> None:
        """Run ``fn(*args)`` on this node, in its context, if it is still alive then."""
        loop, ctx = self._loop_or_fail(), self._context
        # A bound method and the args, not a closure: this runs for every message simulated.
        if delay > 0:
            loop.call_later(delay, self._run_if_alive, fn, args, context=ctx)
        else:
            loop.call_soon(self._run_if_alive, fn, args, context=ctx)

    def _run_if_alive(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        if self.alive:
            fn(*args)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        # Called from a callback already running in this node's context (see _deliver_call),
        # so the task inherits the node's context.
        task = self._loop_or_fail().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- Transport protocol --
    async def declare_queryable(self, key: str, handler: QueryHandler) -> _Entry:
        return self._register(self.mesh._queryables, key, handler)

    async def query(self, key: str, payload: bytes, timeout_s: float) -> bytes:
        loop = self._loop_or_fail()
        if not self.alive:
            raise TransportError(f"node {self.node_id!r} is down")
        targets = [q for q in self.mesh._queryables if _matches(q.key, key) and q.node.alive]
        if not targets:
            raise NoResponder(f"no queryable serves {key!r}")
        fut: asyncio.Future[bytes] = loop.create_future()
        # As with Zenoh, the first OK reply wins; an error fails the query only once every
        # target has failed (a stand-in's refusal must not hide the leader's answer).
        unanswered = [len(targets)]
        for target in targets:
            self._send_request(target, key, payload, fut, unanswered)
        # A bare timer rather than asyncio.wait_for: this is the simulator's hottest path.
        timer = loop.call_later(timeout_s, _time_out, fut, key, timeout_s)
        try:
            return await fut
        finally:
            timer.cancel()

    def _send_request(self, target: _Entry, key: str, payload: bytes,
                      fut: asyncio.Future[bytes], unanswered: list[int]) -> None:
        server = target.node
        delay = self.mesh.network.delay(self.node_id, server.node_id)
        if delay is None:
            return  # lost on the way: the requester times out
        server._deliver_call(self._arrive, target, key, payload, fut, unanswered, delay=delay)

    def _arrive(self, target: _Entry, key: str, payload: bytes, fut: asyncio.Future[bytes],
                unanswered: list[int]) -> None:
        if not target.closed:
            target.node._spawn(self._serve(target, key, payload, fut, unanswered))

    async def _serve(self, target: _Entry, key: str, payload: bytes,
                     fut: asyncio.Future[bytes], unanswered: list[int]) -> None:
        server = target.node
        try:
            reply = await target.callback(key, payload)
        except Exception as exc:  # the handler's bug must not look like a lost message
            unanswered[0] -= 1
            if not fut.done() and unanswered[0] <= 0:
                fut.set_exception(TransportError(f"handler for {key!r} failed: {exc!r}"))
            return
        back = self.mesh.network.delay(server.node_id, self.node_id)
        if back is None:
            return

        self._deliver_call(_resolve, fut, reply, delay=back)

    async def put(self, key: str, payload: bytes) -> None:
        if not self.alive:
            return
        for sub in list(self.mesh._subscribers):
            if sub.node.alive and _matches(sub.key, key):
                delay = self.mesh.network.delay(self.node_id, sub.node.node_id)
                if delay is not None:
                    sub.node._deliver_call(self._sample_to, sub, key, payload, delay=delay)

    @staticmethod
    def _sample_to(sub: _Entry, key: str, payload: bytes) -> None:
        if not sub.closed:
            sub.callback(key, payload)

    async def declare_subscriber(self, key_expr: str, handler: SampleHandler) -> _Entry:
        return self._register(self.mesh._subscribers, key_expr, handler)

    async def declare_liveliness_token(self, key: str) -> _Entry:
        entry = self._register(self.mesh._tokens, key, None)
        self.mesh.refresh_liveliness()
        return entry

    async def watch_liveliness(self, key_expr: str, handler: LivelinessHandler) -> _Entry:
        entry = self._register(self.mesh._watchers, key_expr, handler)
        self.mesh.refresh_liveliness()
        return entry

    async def liveliness_alive(self, key_expr: str, timeout_s: float = 1.0) -> list[str]:
        net = self.mesh.network
        return sorted({t.key for t in self.mesh._tokens
                       if key_matches(key_expr, t.key) and t.node.alive
                       and (t.node is self or net.reachable(t.node.node_id, self.node_id))})


def _resolve(fut: asyncio.Future[bytes], reply: bytes) -> None:
    if not fut.done():
        fut.set_result(reply)


def _time_out(fut: asyncio.Future[bytes], key: str, timeout_s: float) -> None:
    if not fut.done():
        fut.set_exception(TransportTimeout(f"no reply on {key!r} within {timeout_s:g} s"))
