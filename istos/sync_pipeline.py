"""The :class:`~istos.SyncProducer`'s pipeline: jobs leave without waiting one round trip each,
with no event loop (``SyncProducer.pipeline``).

The blocking twin of :mod:`istos.pipeline`, with the same guarantees. Each request is a Zenoh
query sent without waiting (:func:`istos.transport.zenoh_blocking.send_query`); its answer is
read when the caller next calls into the pipeline, and :meth:`SyncPipeline.flush` blocks until
every answer is in. A query nobody answered is sent again while its timeout lasts (an owner
starting up or taking over), as :func:`istos.client.call.query_owner` does for one call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zenoh

from . import codec, keys, protocol
from .client import batches
from .client.call import raise_for_reply
from .core.config import check_queue_name
from .errors import (
    InvalidJob,
    IstosError,
    OwnerUnavailable,
    ProtocolError,
)
from .pipeline import DEFAULT_MAX_IN_FLIGHT, Confirmations, check_max_in_flight, pipeline_item
from .producer import Producer
from .transport.base import NoResponder, TransportError
from .transport.zenoh_blocking import SentQuery, send_query

Inline = Callable[[list[dict[str, Any]]], dict[str, Any]]


@dataclass
class _Request:
    items: list[dict[str, Any]]
    deadline: float
    sent: SentQuery | None = None
    retry_at: float = 0.0
    pause: float = 0.01


class SyncPipeline:
    """Enqueue on queue ``name`` without waiting for each job's acceptance, blocking only in
    :meth:`flush`: made by ``SyncProducer.pipeline(name)``, used as ``with sp.pipeline("q") as
    p: p.enqueue(data)``.

    What holds when (as for :class:`istos.pipeline.Pipeline`):

    - when :meth:`enqueue` returns, the job is checked, has its id and is handed to the
      pipeline: it has left in a request, unless ``max_in_flight`` requests already await
      replies; then it leaves with the first later call (``enqueue`` or ``flush``) that finds
      one answered. It is **sent, not accepted**;
    - when :meth:`flush` returns (also on leaving the ``with`` block), every id handed over
      since the previous flush was **accepted** by the owner (stored through its storage): it
      returns them;
    - when :meth:`flush` raises :class:`~istos.errors.NotAccepted`, its ``job_ids`` are every
      id not confirmed (``refused``: nothing stored; ``unanswered``: may have been stored, send
      again with the same ``job_id`` to make sure) and ``accepted`` the others.

    Not thread-safe: one pipeline per thread (the producer itself is). Raises
    :class:`~istos.errors.ConfigError` for a bad queue name or option.
    """

    def __init__(self, session: zenoh.Session, producer: Producer, prefix: str, name: str,
                 timeout_s: float, inline: Callable[[], Inline | None],
                 *, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 closing: threading.Event | None = None) -> None:
        check_queue_name(name)
        self.name = name
        self._session = session
        self._producer = producer
        self._inline = inline
        self._timeout_s = timeout_s
        self._max_in_flight = check_max_in_flight(max_in_flight)
        self._key = keys.op_key(keys.rpc_base(prefix, name), "enqueue_many")
        self._buffer: list[dict[str, Any]] = []
        self._in_flight: list[_Request] = []
        self._ids = Confirmations()  # since the last flush
        self._closing = closing or threading.Event()  # set: the producer closes, stop pausing
        self._clock = producer.node.clock  # the producer's (deadlines by the Clock port)

    def __enter__(self) -> SyncPipeline:
        self._producer.require_serving()
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()

    @property
    def pending(self) -> int:
        """Jobs handed over whose outcome is not known yet."""
        return len(self._ids.outstanding)

    def enqueue(self, data: Any, *, delay_s: float = 0, priority: int = 0,
                job_id: str | None = None, dedup_s: float | None = None,
                group: str | None = None, expires_s: float | None = None,
                start_by: Any = None, **options: Any) -> str:
        """Hand a job to the pipeline; returns its id (sent, not accepted: see
        :class:`SyncPipeline`). The options mean what they mean for ``enqueue`` (a start
        deadline, ``expires_s`` or ``start_by``, included); its keyed options and
        ``timeout_s`` are refused, as by :meth:`istos.pipeline.Pipeline.enqueue`.

        Raises, with nothing handed over: :class:`~istos.errors.UnsupportedOption` (a
        ``ConfigError``) for one of those; :class:`ConfigError` for a bad option;
        :class:`InvalidJob` for a body msgpack cannot encode or over the size limit, or an id
        the wire refuses; :class:`IstosError` once the producer is closed. Does not wait for
        an answer.
        """
        self._producer.require_serving()
        item = pipeline_item(self._producer, self.name, data, delay_s=delay_s,
                             priority=priority, job_id=job_id, dedup_s=dedup_s, group=group,
                             expires_s=expires_s, start_by=start_by, options=options)
        jid: str = item["job_id"]
        self._buffer.append(item)
        self._ids.handed(jid)
        self._pump()
        return jid

    def flush(self) -> list[str]:
        """Send what is buffered and block until every request is answered (each at most its
        timeout); returns the ids accepted since the previous flush. Raises
        :class:`~istos.errors.NotAccepted` (every id not confirmed, and the accepted ones)
        when any was not; the pipeline then starts afresh."""
        while self._buffer or self._in_flight:
            self._pump()
            if self._in_flight:
                self._wait(self._in_flight[0])
        return self._ids.take(self.name)

    # -- sending ------------------------------------------------------------------------------
    def _pump(self) -> None:
        """Read the answers that arrived, then send the buffer while the window has room."""
        for req in list(self._in_flight):
            self._poll(req)
        while self._buffer and len(self._in_flight) < self._max_in_flight:
            start, end = batches.spans(self._buffer)[0]
            items, self._buffer = self._buffer[start:end], self._buffer[end:]
            self._send_items(items)

    def _send_items(self, items: list[dict[str, Any]]) -> None:
        inline = self._inline()
        if inline is not None:  # the owner serves on this thread's loop: in-process, now
            try:
                raise_for_reply(inline(items), self.name)
            except IstosError as exc:
                self._refused(items, exc)
            else:
                self._settle(items, None)
            return
        req = _Request(items, self._clock.monotonic() + self._timeout_s)
        self._send(req)
        self._in_flight.append(req)

    def _send(self, req: _Request) -> None:
        msg = codec.encode_message({"v": protocol.VERSION, "op": "enqueue_many",
                                    "items": req.items})
        req.sent = send_query(self._session, self._key, msg,
                              max(0.001, req.deadline - self._clock.monotonic()))

    def _wait(self, req: _Request) -> None:
        now = self._clock.monotonic()
        if req.sent is None:
            self._closing.wait(max(0.0, req.retry_at - now))  # a retry pause
        else:
            req.sent.wait(req.deadline - now + 0.05)
        self._poll(req)
        if req in self._in_flight and self._clock.monotonic() > req.deadline + 1.0:
            self._finish(req, OwnerUnavailable(  # Zenoh never ended the query: give up
                f"queue {self.name!r}: no answer within {self._timeout_s:g} s"))

    def _poll(self, req: _Request) -> None:
        now = self._clock.monotonic()
        if req.sent is None:
            if now >= req.retry_at:
                self._send(req)
            return
        if not req.sent.done():
            return
        try:
            reply = codec.decode_message(req.sent.outcome())
            raise_for_reply(reply, self.name)
        except NoResponder:
            if now + req.pause < req.deadline:  # nobody serves the key yet: ask again
                req.sent, req.retry_at = None, now + req.pause
                req.pause = min(req.pause * 2, 0.25)
                return
            self._finish(req, OwnerUnavailable(
                f"no owner of queue {self.name!r} answered within {self._timeout_s:g} s"))
        except TransportError as exc:
            self._finish(req, OwnerUnavailable(f"queue {self.name!r}: {exc}"))
        except IstosError as exc:
            self._in_flight.remove(req)
            self._refused(req.items, exc)
        else:
            self._finish(req, None)

    def _finish(self, req: _Request, exc: IstosError | None) -> None:
        self._in_flight.remove(req)
        self._settle(req.items, exc)

    def _refused(self, items: list[dict[str, Any]], exc: IstosError) -> None:
        if isinstance(exc, InvalidJob | ProtocolError) and len(items) > 1:
            # Refused whole, nothing stored: again one by one, so only the bad item fails.
            for item in items:
                self._send_items([item])
            return
        self._settle(items, exc)

    def _settle(self, items: list[dict[str, Any]], exc: IstosError | None) -> None:
        for item in items:
            self._ids.settle(item["job_id"], exc)
