"""A blocking producer for code without an event loop (Flask and Django views, scripts, threads).

A thin synchronous face over the async producer: each call runs the same
:class:`~istos.producer.Producer` code the app's ``await app.enqueue(...)`` runs (checks, ids,
the request client with its keys, retries and typed errors), driven to its end on the calling
thread (:func:`istos.client.blocking.run_to_end`). Its transport is a blocking query on a Zenoh
session of its own (:class:`~istos.transport.zenoh_blocking.BlockingQuerier`): the calling
thread waits on the reply channel and no event loop takes part, so a request costs one thread
wake-up on this side instead of the async producer's two loop hops. Every method may be called
from any thread, concurrently (the session is thread-safe; nothing else is shared but the id
source).

**No deadlock beside an owner on the calling thread's loop.** A notebook kernel runs cells on
the thread that runs its event loop; if that loop also serves the queue's owner, a blocking
query would wait for an answer the owner can only give once the call returned. So each request
first looks for a running owner of the queue on the calling thread's own loop
(:mod:`istos.owner.leadership.registry`): if there is one, the request is dispatched to it
in-process and runs to completion in this call (an in-memory owner answers without awaiting
anything). An owner whose answer needs its loop (durable storage waits for its write there) cannot
answer inside a blocking call on that loop: such a call raises :class:`~istos.errors.ConfigError` at
once, before anything is sent, naming the fix (``await app.enqueue(...)`` in that cell, or call from
another thread). Owners elsewhere (another thread's loop, another process) are queried over the
mesh.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from datetime import datetime
from typing import Any, TypeVar

import zenoh

from . import errors
from .client import Clients, Remote
from .client.blocking import BlockingClock, run_to_end
from .core.config import check_queue_name
from .errors import ConfigError, OwnerUnavailable
from .lifecycle import UNSET
from .node import LocalOwner
from .owner.leadership import registry
from .payload import CodecChain, PayloadCodec
from .pipeline import DEFAULT_MAX_IN_FLIGHT
from .producer import Producer, check_job_id
from .sync_pipeline import Inline, SyncPipeline
from .tracing import make_tracing
from .transport._zenoh_config import to_zenoh_config
from .transport.zenoh_blocking import BlockingQuerier, open_session

T = TypeVar("T")


class SyncProducer:
    """Put jobs on queues and ask about them, blocking, with no event loop.

    ``zenoh``: a ``zenoh.Config``, a dict, a JSON5 string or file path, or None (Zenoh's
    defaults), as for :class:`~istos.Istos`. ``prefix`` must match the owners'. ``codecs``:
    payload codecs for the bodies it enqueues and the results it reads, the same list as the
    queue's workers (``istos.payload``). ``tracing``: as ``Istos(tracing=...)``, its
    ``create`` spans children of the calling thread's current span. Requests wait
    up to ``request_timeout_s`` for an owner (retrying while none serves the queue), then
    raise :class:`~istos.errors.OwnerUnavailable`. Use as a context manager, or call
    :meth:`close`.

    Raises :class:`~istos.errors.ConfigError` for a bad ``prefix``, ``request_timeout_s``,
    codec or ``tracing``,
    or a Zenoh config Zenoh rejects, and :class:`~istos.errors.MeshUnreachable` when a
    client-mode session reaches no router. Every method raises
    :class:`~istos.errors.IstosError` once the producer is closed, and
    :class:`~istos.errors.ConfigError` when called on a thread whose event loop runs the
    queue's owner with durable storage (see the module docstring).
    """

    def __init__(self, zenoh: Any = None, *, prefix: str = "istos",
                 request_timeout_s: float = 5.0, codecs: Iterable[PayloadCodec] = (),
                 tracing: Any = None) -> None:
        if isinstance(request_timeout_s, bool) or not isinstance(request_timeout_s, int | float) \
                or not request_timeout_s > 0:
            raise ConfigError(f"request_timeout_s must be > 0, got {request_timeout_s!r}")
        if not isinstance(prefix, str) or not prefix:
            raise ConfigError(f"prefix must be a non-empty string, got {prefix!r}")
        self.prefix = prefix
        self.request_timeout_s = float(request_timeout_s)
        self._payload = CodecChain(codecs)  # checked before a session is opened
        self._tracing = make_tracing(tracing)  # spans in the calling thread's trace
        self._session = open_session(to_zenoh_config(zenoh), "SyncProducer")
        self._closed = False
        self._closing = threading.Event()  # cuts a retry pause short when close() is called
        # The Clock port's live adapter, its sleeps blocking this thread (never time.* here).
        self._remote = Remote(BlockingQuerier(self._session), prefix, self.request_timeout_s,
                              BlockingClock(self._closing))
        self._producer = Producer(self._remote, Clients(self._remote), self._require_open,
                                  payload=self._payload, tracing=self._tracing)

    # -- the calls ------------------------------------------------------------------------------
    def enqueue(self, name: str, data: Any, *, delay_s: float = 0, priority: int = 0,
                job_id: str | None = None, unique_key: str | None = None,
                unique: str | None = None, unique_s: float | None = None,
                debounce_key: str | None = None, debounce_s: float | None = None,
                debounce_max_s: float | None = None, debounce: str | None = None,
                expires_s: float | None = None, start_by: Any = None,
                after: Iterable[Any] | None = None,
                on_parent_failure: str = "cancel") -> str:
        """Put a job on queue ``name``; returns its id (an :class:`~istos.Enqueued`) once the
        owner stored it (as :meth:`Istos.enqueue`: idempotent by ``job_id``, and by
        ``unique_key`` within its ``unique`` scope; one run per burst of calls with a
        ``debounce_key``; ``expires_s`` or ``start_by``: its start deadline, past which a job
        not started ends ``expired``; ``after``: its parents, ``(queue, job_id)`` pairs or
        returned ids, with ``on_parent_failure``: it waits until they are done).

        Raises, before sending: :class:`ConfigError` for a bad name, ``delay_s``,
        ``priority``, ``job_id``, ``unique_key``, ``unique``, ``unique_s``, a debounce
        option, ``expires_s``, ``start_by``, ``after`` or ``on_parent_failure``,
        :class:`InvalidJob` for a body msgpack cannot encode or over the size limit; after
        sending: :class:`JobNotFound` or :class:`~istos.ParentFailed` for a parent
        (``after``), :class:`OwnerUnavailable` when no owner answers within
        ``request_timeout_s``, or the owner's typed error. Blocks the calling thread only.
        """
        # An explicit timeout: one request per call (coalescing needs a loop turn).
        return self._run(name, lambda p: p.enqueue(name, data, delay_s=delay_s,
                                                   priority=priority, job_id=job_id,
                                                   timeout_s=self.request_timeout_s,
                                                   unique_key=unique_key, unique=unique,
                                                   unique_s=unique_s,
                                                   debounce_key=debounce_key,
                                                   debounce_s=debounce_s,
                                                   debounce_max_s=debounce_max_s,
                                                   debounce=debounce,
                                                   expires_s=expires_s, start_by=start_by,
                                                   after=after,
                                                   on_parent_failure=on_parent_failure))

    def enqueue_many(self, name: str, items: Iterable[Any], *,  # noqa: PLR0913
                     delay_s: float = 0,
                     priority: int = 0, job_ids: Sequence[str] | None = None,
                     unique_keys: Sequence[str | None] | None = None,
                     unique: str | None = None, unique_s: float | None = None,
                     expires_s: float | None = None, start_by: Any = None) -> list[str]:
        """Put many jobs on ``name`` in as few requests as the frame cap allows; returns their
        ids in order (as :meth:`Istos.enqueue_many`: every item checked before any is sent;
        ``unique_keys`` one key or None per item, with the batch's ``unique`` scope and
        ``unique_s``; ``expires_s`` or ``start_by``: every item's start deadline).

        Raises :class:`ConfigError` or :class:`InvalidJob` naming a bad item (nothing sent),
        and :class:`OwnerUnavailable` or the owner's typed error for a request that failed:
        requests before it stay stored, and the message says how many jobs were.
        """
        return self._run(name, lambda p: p.enqueue_many(name, items, delay_s=delay_s,
                                                        priority=priority, job_ids=job_ids,
                                                        unique_keys=unique_keys,
                                                        unique=unique, unique_s=unique_s,
                                                        expires_s=expires_s,
                                                        start_by=start_by))

    def update(self, name: str, job_id: str, *, data: Any = UNSET,
               delay_s: float | None = None, run_at: float | datetime | None = None,
               priority: int | None = None) -> str:
        """Edit a waiting job, as :meth:`Istos.update`: returns ``"updated"``,
        ``"too_late"`` or ``"unknown"``; raises :class:`ConfigError` naming a bad field
        (nothing sent), :class:`StorageUnavailable` if the owner's write failed (nothing
        changed), or :class:`OwnerUnavailable`. Blocks the calling thread only."""
        return self._run(name, lambda p: p.update(name, job_id, data=data, delay_s=delay_s,
                                                  run_at=run_at, priority=priority,
                                                  timeout_s=self.request_timeout_s))

    def result(self, name: str, job_id: str) -> dict[str, Any]:
        """Where job ``job_id`` stands: ``{"state": ..., "result": ...}`` as
        :meth:`Istos.result` returns it. Raises :class:`ConfigError` (or :class:`InvalidJob`,
        for an id the wire refuses) for a bad name or id, and
        :class:`OwnerUnavailable` when no owner answers."""
        check_queue_name(name)
        check_job_id(name, job_id)
        return self._run(name, lambda p: p.result(name, job_id))

    def dead_letters(self, name: str) -> list[dict[str, Any]]:
        """Every dead job of ``name``, oldest first, fetched page by page (as
        :meth:`Istos.dead_letters`). Raises :class:`ConfigError` for a bad name and
        :class:`OwnerUnavailable` when no owner answers."""
        check_queue_name(name)
        return self._run(name, lambda p: p.dead_letters(name))

    def pipeline(self, name: str, *, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> SyncPipeline:
        """A pipelined producer of queue ``name``: ``with sp.pipeline(name) as p:
        p.enqueue(data)`` returns each id without waiting for its answer (sent, not accepted),
        and leaving the block (or ``p.flush()``) confirms every id or raises
        :class:`NotAccepted` listing those not confirmed; the exact guarantees are on
        :class:`~istos.sync_pipeline.SyncPipeline`. Raises :class:`ConfigError` for a bad
        name or ``max_in_flight``."""
        def inline() -> Inline | None:  # an owner on this thread's loop answers in-process
            if registry.on_this_loop(self.prefix, name) is None:
                return None
            return lambda items: self._run(
                name, lambda p: p.client(name).call("enqueue_many", items=items))

        return SyncPipeline(self._session, self._producer, self.prefix, name,
                            self.request_timeout_s, inline,
                            max_in_flight=max_in_flight, closing=self._closing)

    def close(self) -> None:
        """Close the session and cut any retry pause short (idempotent, never raises); calls
        afterwards raise :class:`IstosError`."""
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
    def _require_open(self) -> None:
        if self._closed:
            raise errors.IstosError("this SyncProducer is closed")

    def _run(self, queue: str, call: Callable[[Producer], Coroutine[Any, Any, T]]) -> T:
        """``call(producer)`` run to its end within this call: to an owner of ``queue`` that
        serves on the calling thread's loop in-process, else over the mesh."""
        self._require_open()
        check_queue_name(queue)
        owner = registry.on_this_loop(self.prefix, queue)
        if owner is not None:
            return _run_inline(call(self._inline_producer(owner, queue)), owner, queue)
        return run_to_end(call(self._producer))

    def _inline_producer(self, owner: LocalOwner, queue: str) -> Producer:
        """A producer whose client dispatches to ``owner`` in-process (the same code path as
        an app's call to its own owner)."""
        remote = dataclasses.replace(self._remote,
                                     local_owner=lambda q: owner if q == queue else None)
        return Producer(remote, Clients(remote), self._require_open, payload=self._payload,
                        tracing=self._tracing)


def _run_inline(coro: Coroutine[Any, Any, T], owner: LocalOwner, queue: str) -> T:
    """Run one call to an owner of the calling thread's loop, within this call."""
    if owner.durable:
        coro.close()  # never started: nothing was sent
        raise ConfigError(
            f"queue {queue!r}: its owner runs on this thread's event loop with durable "
            "storage, whose writes need that loop, which this blocking call holds: use "
            "`await app.enqueue(...)` (and friends) here, or call the SyncProducer from "
            "another thread")
    try:
        pending = coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    # Unexpected for an in-memory owner: finish the request on the loop, and say so.
    asyncio.ensure_future(_finish(coro, pending))
    raise OwnerUnavailable(f"queue {queue!r}: the in-process owner could not answer within "
                           "this call (it completes in the background; check with result())")


async def _finish(coro: Any, pending: Any) -> None:
    """Drive a coroutine that suspended on ``pending`` (a future, or None for a bare yield)
    to its end, as its Task would have."""
    while True:
        if pending is None:
            await asyncio.sleep(0)  # a bare yield, as its Task would have made: no clock
        else:
            await asyncio.wait([pending])
        try:
            pending = coro.send(None)
        except StopIteration:
            return
