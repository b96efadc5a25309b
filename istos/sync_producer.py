"""A blocking producer for code without an event loop (Flask and Django views, scripts, threads).

One Zenoh session of its own and a blocking ``Session.get`` per request: the calling thread
waits on the reply channel and no event loop takes part, so a request costs one thread wake-up
on this side instead of the async producer's two loop hops. Every method may be called from any
thread, concurrently (the session is thread-safe; nothing else is shared but the id source).

**No deadlock beside an owner on the calling thread's loop.** A notebook kernel runs cells on
the thread that runs its event loop; if that loop also serves the queue's owner, a blocking
query would wait for an answer the owner can only give once the call returned. So each request
first looks for a running owner of the queue on the calling thread's own loop
(:mod:`istos.owner.registry`): if there is one, the request is dispatched to it in-process and
runs to completion in this call (an in-memory owner answers without awaiting anything). An owner
whose answer needs its loop (durable storage waits for its write there) cannot answer inside a
blocking call on that loop: such a call raises :class:`~istos.errors.ConfigError` at once, before
anything is sent, naming the fix (``await app.enqueue(...)`` in that cell, or call from another
thread). Owners elsewhere (another thread's loop, another process) are queried over the mesh.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import zenoh

from . import codec, errors, keys, protocol
from .client import batches
from .clock import SystemClock
from .core.config import check_delay, check_priority, check_queue_name
from .errors import ConfigError, MeshUnreachable, OwnerUnavailable
from .ids import IdSource
from .owner import registry
from .producer import check_batch, check_job_id, decode_dead, decode_result
from .transport._zenoh_config import to_zenoh_config

_NO_RESPONDER_PAUSE_S = (0.01, 0.25)  # first and longest pause while nobody serves the key


class SyncProducer:
    """Put jobs on queues and ask about them, blocking, with no event loop.

    ``zenoh``: a ``zenoh.Config``, a dict, a JSON5 string or file path, or None (Zenoh's
    defaults), as for :class:`~istos.Istos`. ``prefix`` must match the owners'. Requests wait
    up to ``request_timeout_s`` for an owner (retrying while none serves the queue), then
    raise :class:`~istos.errors.OwnerUnavailable`. Use as a context manager, or call
    :meth:`close`.
    """

    def __init__(self, zenoh: Any = None, *, prefix: str = "istos",
                 request_timeout_s: float = 5.0) -> None:
        if isinstance(request_timeout_s, bool) or not isinstance(request_timeout_s, int | float) \
                or not request_timeout_s > 0:
            raise ConfigError(f"request_timeout_s must be > 0, got {request_timeout_s!r}")
        if not isinstance(prefix, str) or not prefix:
            raise ConfigError(f"prefix must be a non-empty string, got {prefix!r}")
        self.prefix = prefix
        self.request_timeout_s = float(request_timeout_s)
        self._ids = IdSource()
        self._session = _open(to_zenoh_config(zenoh))
        self._closed = False
        self._clock = SystemClock()  # the Clock port's live adapter, not time.* directly
        self._closing = threading.Event()  # cuts a retry pause short when close() is called

    # -- the calls ------------------------------------------------------------------------------
    def enqueue(self, name: str, data: Any, *, delay_s: float = 0, priority: int = 0,
                job_id: str | None = None) -> str:
        """Put a job on queue ``name``; returns its id (as :meth:`Istos.enqueue`: idempotent by
        ``job_id``; :class:`InvalidJob` before sending for a body msgpack cannot encode)."""
        check_queue_name(name)
        body = codec.encode_body(data, queue=name)
        fields: dict[str, Any] = {"body": body, "delay_s": check_delay(delay_s),
                                  "priority": check_priority(priority)}
        if job_id is not None:
            check_job_id(name, job_id)
        fields["job_id"] = job_id or self._ids.new()
        return str(self._call(name, "enqueue", fields)["job_id"])

    def enqueue_many(self, name: str, items: Iterable[Any], *, delay_s: float = 0,
                     priority: int = 0, job_ids: Sequence[str] | None = None) -> list[str]:
        """Put many jobs on ``name`` in as few requests as the frame cap allows; returns their
        ids in order (as :meth:`Istos.enqueue_many`: every item checked before any is sent)."""
        bodies, ids, delay, prio = check_batch(name, items, delay_s, priority, job_ids)
        if ids is None:
            ids = [self._ids.new() for _ in bodies]
        stored = 0
        for frame in batches.frames(ids, bodies, delay, prio):
            try:
                self._call(name, "enqueue_many", {"items": frame})
            except errors.IstosError as exc:
                if not stored:
                    raise
                raise type(exc)(f"{exc} (the first {stored} of {len(ids)} jobs were stored; "
                                "send the batch again with the same job_ids to add the rest)"
                                ) from exc
            stored += len(frame)
        return ids

    def result(self, name: str, job_id: str) -> dict[str, Any]:
        """``{"state": ..., "result": ...}`` for a job (as :meth:`Istos.result`)."""
        check_queue_name(name)
        check_job_id(name, job_id)
        return decode_result(self._call(name, "result", {"job_id": job_id}))

    def dead_letters(self, name: str) -> list[dict[str, Any]]:
        """Every dead job of ``name``, oldest first, fetched page by page (as
        :meth:`Istos.dead_letters`)."""
        check_queue_name(name)
        page: list[dict[str, Any]] = []
        while True:
            reply = self._call(name, "dead", {"offset": len(page), "limit": protocol.MAX_PAGE})
            page.extend(reply["dead"])
            if not reply["dead"] or not reply.get("more"):
                return decode_dead(page)

    def close(self) -> None:
        """Close the session (idempotent); calls afterwards raise :class:`IstosError`."""
        if self._closed:
            return
        self._closed = True
        self._closing.set()
        try:
            self._session.close()
        except zenoh.ZError:
            pass  # already closed with its process's runtime

    def __enter__(self) -> SyncProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the request path -----------------------------------------------------------------------
    def _call(self, queue: str, op: str, fields: dict[str, Any]) -> dict[str, Any]:
        if self._closed:
            raise errors.IstosError("this SyncProducer is closed")
        msg = {"v": protocol.VERSION, "op": op, **fields}
        owner = registry.on_this_loop(self.prefix, queue)
        if owner is not None:
            reply = _dispatch_inline(owner, msg, queue)
        else:
            key = keys.rpc_key(self.prefix, queue, op)
            reply = codec.decode_message(self._query(key, codec.encode_message(msg), queue))
        if reply.get("ok"):
            return reply
        cls = protocol.ERROR_CLASSES.get(str(reply.get("error")), errors.RemoteError)
        raise cls(f"queue {queue!r}: {reply.get('message') or reply.get('error')}")

    def _query(self, key: str, payload: bytes, queue: str) -> bytes:
        """The first OK reply to ``payload`` on ``key``, retried while nobody serves it."""
        deadline = self._clock.monotonic() + self.request_timeout_s
        pause, longest = _NO_RESPONDER_PAUSE_S
        error: str | None = None
        while True:
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                break
            try:
                replies = self._session.get(key, payload=payload, timeout=remaining,
                                            consolidation=zenoh.ConsolidationMode.NONE)
                for reply in replies:  # blocks this thread only, until a reply or the end
                    ok = reply.ok
                    if ok is not None:
                        return ok.payload.to_bytes()
                    err = reply.err
                    error = err.payload.to_bytes().decode("utf-8", "replace") if err else "?"
            except zenoh.ZError as exc:
                raise OwnerUnavailable(f"queue {queue!r}: request failed: {exc}") from exc
            if error is not None:
                raise OwnerUnavailable(f"queue {queue!r}: the owner answered with an error: "
                                       f"{error}")
            if self._clock.monotonic() >= deadline:
                break
            # Nobody served the key (the owner may not be discovered yet): retry, backing off.
            if self._closing.wait(min(pause, max(0.0, deadline - self._clock.monotonic()))):
                break
            pause = min(pause * 2, longest)
        raise OwnerUnavailable(
            f"no owner of queue {queue!r} answered within {self.request_timeout_s:g} s (is a "
            f"node serving app.queue({queue!r}) under prefix {self.prefix!r} reachable?)")


def _dispatch_inline(owner: registry.RunningOwner, msg: dict[str, Any],
                     queue: str) -> dict[str, Any]:
    """Run one request on an owner of the calling thread's loop, within this call."""
    if owner.durable:
        raise ConfigError(
            f"queue {queue!r}: its owner runs on this thread's event loop with durable "
            "storage, whose writes need that loop, which this blocking call holds: use "
            "`await app.enqueue(...)` (and friends) here, or call the SyncProducer from "
            "another thread")
    coro = owner.dispatch(msg)
    try:
        pending = coro.send(None)
    except StopIteration as done:
        reply: dict[str, Any] = done.value
        return reply
    # Unexpected for an in-memory owner: finish the request on the loop, and say so.
    asyncio.ensure_future(_finish(coro, pending))
    raise OwnerUnavailable(f"queue {queue!r}: the in-process owner could not answer within "
                           "this call (it completes in the background; check with result())")


async def _finish(coro: Any, pending: Any) -> None:
    """Drive a coroutine that suspended on ``pending`` (a future, or None for a bare yield)
    to its end, as its Task would have."""
    while True:
        if pending is None:
            await asyncio.sleep(0)
        else:
            await asyncio.wait([pending])
        try:
            pending = coro.send(None)
        except StopIteration:
            return


def _open(config: zenoh.Config) -> zenoh.Session:
    try:
        return zenoh.open(config)
    except zenoh.ZError as exc:
        if "unable to connect" in str(exc).lower():
            raise MeshUnreachable(f"the SyncProducer reached no Zenoh router at its connect "
                                  f"endpoints: {exc}") from exc
        raise ConfigError(f"zenoh could not open a session with this config: {exc}") from exc
