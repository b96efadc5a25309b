"""A pipelined producer: jobs leave without waiting one round trip each (``app.pipeline``).

:class:`Pipeline` is the opt-in producer path for a caller that puts many jobs on one queue and
does not need each one's answer before the next: ``p.enqueue(...)`` checks the job, chooses its
id, hands it to the pipeline and returns the id at once; the jobs handed over until the caller
next yields to the event loop leave together, as soon as it does, as ``enqueue_many`` requests
(cut under the frame cap, as :func:`istos.client.batches.cut` cuts a batch), with at most
``max_in_flight`` requests awaiting their replies (the rest leave as soon as one replies).
``await p.flush()`` waits for every reply and raises :class:`~istos.errors.NotAccepted` listing
each id whose acceptance was not confirmed. The ids are chosen here, so sending one again is
idempotent while the queue holds it (or within its ``dedup_s``) exactly as for
``app.enqueue(..., job_id=...)``. The exact guarantees are on :class:`Pipeline`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .client import OwnerClient, batches
from .core.config import check_queue_name
from .errors import (
    ConfigError,
    InvalidJob,
    IstosError,
    NotAccepted,
    OwnerUnavailable,
    ProtocolError,
    UnsupportedOption,
)
from .producer import Producer, check_enqueue, deadline_fields

DEFAULT_MAX_IN_FLIGHT = 4

_KEYED = ("a pipeline's enqueue returns the job's own id at once, while a keyed call may "
          "resolve to another job (its reply names it): use app.enqueue (or "
          "enqueue_many's unique_keys)")
UNSUPPORTED_OPTIONS: dict[str, str] = {
    "unique_key": _KEYED, "unique": _KEYED, "unique_s": _KEYED,
    "debounce_key": _KEYED, "debounce_s": _KEYED, "debounce_max_s": _KEYED,
    "debounce": _KEYED,
    "timeout_s": "a pipeline's requests carry several jobs each: give timeout_s to the "
                 "pipeline itself",
}
"""``app.enqueue`` options a pipeline's ``enqueue`` refuses (:class:`UnsupportedOption`),
each with the reason the error gives."""


def pipeline_item(producer: Producer, name: str, data: Any, *,  # noqa: PLR0913 (its options)
                  delay_s: float, priority: int,
                  job_id: str | None, dedup_s: float | None, group: str | None,
                  expires_s: float | None, start_by: Any,
                  options: dict[str, Any]) -> dict[str, Any]:
    """One job as a pipeline's ``enqueue_many`` request carries it (its id chosen), after
    every check ``app.enqueue`` makes; what both pipelines' ``enqueue`` share.

    Raises :class:`UnsupportedOption` for an ``app.enqueue`` option in ``options``
    (:data:`UNSUPPORTED_OPTIONS`), ``TypeError`` for any other name there, and what
    ``app.enqueue`` raises for a bad job or option.
    """
    for option in options:
        why = UNSUPPORTED_OPTIONS.get(option)
        if why is not None:
            raise UnsupportedOption(option, why)
        raise TypeError(f"enqueue() got an unexpected keyword argument {option!r}")
    body, delay, prio, window, grp = check_enqueue(
        name, data, delay_s=delay_s, priority=priority, job_id=job_id,
        dedup_s=dedup_s, group=group, name_checked=True)
    deadline = None if expires_s is None and start_by is None else \
        deadline_fields(expires_s, start_by, delay, producer.node.clock.now())
    if producer.payload.codecs:
        body = producer.payload.wrap(body, queue=name)
    producer.require_serving()
    return batches.enqueue_item(job_id or producer.node.ids.new(), body, delay, prio, window,
                                grp, every=deadline)


def check_max_in_flight(value: object) -> int:
    """``max_in_flight`` as the pipelines take it: an int >= 1 (ConfigError otherwise)."""
    if type(value) is not int or value < 1:
        raise ConfigError(f"max_in_flight must be an int >= 1, got {value!r}")
    return value


class Confirmations:
    """What became of the ids a pipeline handed over since its last flush (both pipelines'
    accounting): ``outstanding`` (no outcome yet), ``accepted`` (in the order the owner
    confirmed them) and ``failed`` (each id's reason). An id accepted stays accepted: a twin
    of it in the same flush that failed does not undo that."""

    __slots__ = ("accepted", "failed", "outstanding")

    def __init__(self) -> None:
        self.accepted: dict[str, None] = {}
        self.failed: dict[str, IstosError] = {}
        self.outstanding: set[str] = set()

    def handed(self, job_id: str) -> None:
        """``job_id`` was handed over (its outcome is not known yet)."""
        self.outstanding.add(job_id)

    def settle(self, job_id: str, exc: IstosError | None) -> None:
        """``job_id``'s request was answered: accepted (``exc`` None) or not (``exc``)."""
        self.outstanding.discard(job_id)
        if exc is None:
            self.accepted[job_id] = None
            self.failed.pop(job_id, None)  # a twin id of the same flush was stored after all
        elif job_id not in self.accepted:
            self.failed[job_id] = exc

    def take(self, name: str) -> list[str]:
        """End the flush of queue ``name``: the ids accepted since the previous one, and start
        afresh. Raises :class:`~istos.errors.NotAccepted` (every id not confirmed, and the
        accepted ones) when any was not."""
        accepted, failed = list(self.accepted), self.failed
        self.accepted, self.failed = {}, {}
        if failed:
            raise NotAccepted(name, failed, accepted)
        return accepted


class Pipeline:
    """Enqueue on queue ``name`` without awaiting each job's acceptance: made by
    ``app.pipeline(name)``, used as ``async with app.pipeline("q") as p: p.enqueue(data)``.

    What holds when:

    - when :meth:`enqueue` returns, the job is checked (as ``app.enqueue`` checks it, raising
      the same errors), has its id, and is handed to the pipeline: it leaves this process in a
      request sent as soon as the caller next yields to the event loop (any ``await`` that
      suspends), together with every job handed over until then (later only while
      ``max_in_flight`` requests already await replies: then as soon as one replies). It is
      **sent, not accepted**: nothing says the owner stored it yet;
    - when :meth:`flush` returns (also on leaving the ``async with`` block), every id enqueued
      since the previous flush was **accepted**: stored by the queue's owner (written through
      its storage, so as durable as that storage), exactly as if ``await app.enqueue(...)``
      had returned it. It returns those ids, in the order they were confirmed;
    - when :meth:`flush` raises :class:`~istos.errors.NotAccepted`, its ``job_ids`` are every
      id since the previous flush whose acceptance was not confirmed, and ``accepted`` the
      others (each one accepted as above). Of the ids not confirmed, ``refused`` were refused
      by the owner (nothing stored); the others (``unanswered``: no answer in time, or the
      pipeline was cancelled) may or may not have been stored. Sending any of them again with
      the same ``job_id`` is idempotent while the queue holds it (and, with ``dedup_s``, that
      long after it finished), so resending is the way to make sure.

    No id is dropped between the two: each is in the returned list, or in the error (so leave
    the block, or flush, before relying on any job: a pipeline never flushed reports nothing,
    though its requests still complete). The jobs
    of one request are stored in one write (all or none); requests in flight at once may be
    stored in any order. Unlike ``app.enqueue``, a pipeline sends no job meta (workflow steps
    go one by one).

    ``max_in_flight``: requests awaiting their replies at once (default 4). ``timeout_s``: each
    request's timeout (default: the app's ``request_timeout_s``). Raises
    :class:`~istos.errors.ConfigError` for a bad option, and :class:`~istos.errors.IstosError`
    on entering when the app is not serving.
    """

    def __init__(self, producer: Producer, name: str, *,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 timeout_s: float | None = None) -> None:
        check_queue_name(name)
        self.name = name
        self._producer = producer
        self._max_in_flight = check_max_in_flight(max_in_flight)
        self._timeout_s = timeout_s
        self._client: OwnerClient | None = None
        self._buffer: list[dict[str, Any]] = []  # items handed over, not sent yet
        self._scheduled = False  # a send is due once the caller yields to the loop
        self._in_flight = 0
        self._tasks: set[asyncio.Task[None]] = set()  # strong references while they run
        self._ids = Confirmations()  # since the last flush
        self._waiters: dict[str, asyncio.Future[str]] = {}
        self._idle = asyncio.Event()
        self._idle.set()

    async def __aenter__(self) -> Pipeline:
        self._producer.require_serving()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.flush()

    @property
    def pending(self) -> int:
        """Jobs handed over whose outcome is not known yet (buffered or in flight)."""
        return len(self._ids.outstanding)

    def enqueue(self, data: Any, *, delay_s: float = 0, priority: int = 0,
                job_id: str | None = None, dedup_s: float | None = None,
                group: str | None = None, expires_s: float | None = None,
                start_by: Any = None, **options: Any) -> str:
        """Hand a job to the pipeline; returns its id at once (sent, not accepted: see
        :class:`Pipeline`). The options mean what they mean for ``app.enqueue`` (a start
        deadline, ``expires_s`` or ``start_by``, included); its keyed options
        (``unique_key``, ``unique``, ``unique_s``, ``debounce_key``, ``debounce_s``,
        ``debounce_max_s``, ``debounce``) and ``timeout_s`` are refused
        (:data:`UNSUPPORTED_OPTIONS`).

        Raises, with nothing handed over: :class:`UnsupportedOption` (a ``ConfigError``) for
        one of those; :class:`ConfigError` for a bad ``delay_s``, ``priority``, ``job_id``,
        ``dedup_s``, ``group``, ``expires_s`` or ``start_by``; :class:`InvalidJob` for a body
        msgpack cannot encode, one over the size limit, or an id the wire refuses;
        :class:`IstosError` when the app is not serving. Never waits.
        """
        producer = self._producer
        item = pipeline_item(producer, self.name, data, delay_s=delay_s, priority=priority,
                             job_id=job_id, dedup_s=dedup_s, group=group,
                             expires_s=expires_s, start_by=start_by, options=options)
        if self._client is None:
            self._client = producer.client(self.name)
        jid: str = item["job_id"]
        self._buffer.append(item)
        self._ids.handed(jid)
        self._idle.clear()
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._send_ready)
        return jid

    def confirmation(self, job_id: str) -> asyncio.Future[str]:
        """A future of one id handed over since the last flush: its result is the id once the
        owner accepted the job; its exception the reason it was not confirmed (the error
        :meth:`flush` also reports). Raises :class:`KeyError` for an id this pipeline does not
        know (never handed over, or settled before the previous flush)."""
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        ids = self._ids
        if job_id in ids.accepted:
            fut.set_result(job_id)
        elif job_id in ids.failed:
            fut.set_exception(ids.failed[job_id])
        elif job_id in ids.outstanding:
            return self._waiters.setdefault(job_id, fut)
        else:
            raise KeyError(job_id)
        return fut

    async def flush(self) -> list[str]:
        """Send what is buffered and wait for every reply; returns the ids accepted since the
        previous flush, in the order the owner confirmed them.

        Raises :class:`~istos.errors.NotAccepted` (listing every id not confirmed, and the
        accepted ones) when any was not; the pipeline then starts afresh and can be used
        again. Cancelling the flush leaves the requests in flight running.
        """
        if self._buffer:
            self._send_ready()
        await self._idle.wait()
        return self._ids.take(self.name)

    # -- sending ------------------------------------------------------------------------------
    def _send_ready(self) -> None:
        """Send the buffered jobs, one request per frame, while the window has room."""
        self._scheduled = False
        if not self._buffer or self._in_flight >= self._max_in_flight:
            return
        buffer = self._buffer
        spans = batches.spans(buffer)
        room = self._max_in_flight - self._in_flight
        loop = asyncio.get_running_loop()
        for start, end in spans[:room]:
            self._in_flight += 1
            task = loop.create_task(self._send(buffer[start:end]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._buffer = buffer[spans[room - 1][1]:] if len(spans) > room else []

    async def _send(self, items: list[dict[str, Any]]) -> None:
        try:
            await self._request(items)
        finally:
            self._in_flight -= 1
            if self._buffer:
                self._send_ready()
            if not self._in_flight and not self._buffer:
                self._idle.set()

    async def _request(self, items: list[dict[str, Any]]) -> None:
        assert self._client is not None
        try:
            await self._client.call("enqueue_many", self._timeout_s, items=items)
        except (InvalidJob, ProtocolError) as exc:
            if len(items) == 1:
                self._settle(items, exc)
            else:  # refused whole, nothing stored: one by one, so only the bad item fails
                for item in items:
                    await self._request([item])
            return
        except IstosError as exc:
            self._settle(items, exc)
            return
        except BaseException as exc:  # cancelled (the app stopping) or a bug: say so, per id
            self._settle(items, OwnerUnavailable(
                f"queue {self.name!r}: the pipeline's request ended without an answer "
                f"({type(exc).__name__})"))
            raise
        self._settle(items, None)

    def _settle(self, items: list[dict[str, Any]], exc: IstosError | None) -> None:
        for item in items:
            jid = item["job_id"]
            self._ids.settle(jid, exc)
            waiter = self._waiters.pop(jid, None)
            if waiter is not None and not waiter.done():
                if exc is None:
                    waiter.set_result(jid)
                else:
                    waiter.set_exception(type(exc)(str(exc)))
