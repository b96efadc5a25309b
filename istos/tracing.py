"""OpenTelemetry tracing of jobs, from ``enqueue`` to the worker's ack (the ``otel`` extra).

The only module of the engine that imports ``opentelemetry``, and only when an app is built
with tracing on (:func:`make_tracing`): an app without it holds ``None`` and pays one ``is
None`` check per enqueue and per job.

What is traced (OpenTelemetry's messaging semantic conventions, ``messaging.system="istos"``):

- ``create <queue>`` (PRODUCER): one per ``enqueue`` (or ``enqueue_many`` batch), around the
  request to the owner; its context goes into the job's meta as W3C ``traceparent`` /
  ``tracestate`` (:mod:`istos.core.trace_meta`);
- ``receive <queue>`` (CONSUMER): per claimed job, spanning the claim's round trip;
- ``process <queue>`` (CONSUMER): per attempt, around the function (and a chain's
  continuation); current while the function runs, so its own spans nest under it;
- ``settle <queue>`` (CLIENT): per attempt, from the ack/nack to the owner's answer.

The worker's spans are children of the producer's ``create`` span, so every attempt of a job
(retries, redeliveries after a lost lease) lands in the producer's trace as its own
``process`` span with ``istos.job.attempt``, and a chain's next step, enqueued
inside ``process``, continues it.

Best effort, bounded: a span is *ended* (which runs the SDK's processors and, with a
``SimpleSpanProcessor``, the exporter) on one background thread, through a queue of at most
:data:`MAX_PENDING_SPANS` spans; past that spans are dropped and counted. A raising or slow
exporter never delays nor fails a job, and no tracing call raises into the engine.
"""

from __future__ import annotations

import contextlib
import logging
import queue as queue_mod
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from .core.trace_meta import TRACE_KEY
from .errors import ConfigError

log = logging.getLogger("istos.tracing")
T = TypeVar("T")

MAX_PENDING_SPANS = 10_000
"""Spans waiting to be ended on the background thread; more are dropped (and counted)."""
MAX_OPEN_SETTLES = 4096
"""``settle`` spans a worker keeps open waiting for the owner's answer (the oldest end early),
and claimed jobs' contexts kept for their ``process`` span (the oldest are read again)."""
SYSTEM = "istos"


def make_tracing(option: Any) -> Tracing | None:
    """The tracing an app's ``tracing=`` option asks for: ``None`` (the default) traces
    through the global tracer provider when ``opentelemetry`` is installed and not otherwise;
    ``False`` never traces; ``True`` traces and raises :class:`ConfigError` when
    ``opentelemetry`` is missing; any other value is a ``TracerProvider`` to trace with
    (:class:`ConfigError` if it has no ``get_tracer``)."""
    if option is False:
        return None
    if option is None or option is True:
        try:
            return Tracing(None)
        except ImportError as exc:
            if option is None:
                return None
            raise ConfigError("tracing=True needs opentelemetry: pip install "
                              "'istos-nb[otel]'") from exc
    if not callable(getattr(option, "get_tracer", None)):
        raise ConfigError(f"tracing must be None, True, False or a TracerProvider, got "
                          f"{option!r}")
    return Tracing(option)


class Tracing:
    """One app's tracer and propagator. Raises ImportError without ``opentelemetry``."""

    def __init__(self, provider: Any) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator,
        )

        self._trace, self._context = trace, context
        self._kinds = trace.SpanKind
        self._error = trace.Status(trace.StatusCode.ERROR)
        self._propagator = TraceContextTextMapPropagator()
        # (the version read, not imported: importing the package here would cycle)
        version = getattr(sys.modules.get("istos"), "__version__", None)
        self.tracer = (provider or trace).get_tracer("istos", version)
        self._global = provider is None  # tracing through whatever provider is set globally
        self._proxy = trace.ProxyTracerProvider  # the global provider while none is set
        self._settles: OrderedDict[str, Any] = OrderedDict()  # lease token -> settle span
        # lease token -> the producer's context, read once at the claim for its process span
        self._parents: OrderedDict[str, Any] = OrderedDict()

    # -- producer --------------------------------------------------------------------------------
    async def enqueue(self, queue: str, job_id: str | None, count: int,
                      send: Callable[[dict[str, str] | None], Awaitable[T]], *,
                      parent: dict[str, str] | None = None) -> T:
        """Run ``send(trace_entry)`` (the request to the owner) inside a ``create`` span;
        ``trace_entry`` is the W3C context the jobs carry (None if there is none to carry).
        ``parent``: a trace entry to continue instead of the current span (a chord's
        callback, enqueued by its owner, continues its last member's). Raises what ``send``
        raises (the span records it)."""
        if parent is None and self.idle():
            return await send(None)
        span, entry = None, None
        try:
            attrs = _attrs(queue, "create", "enqueue")
            if job_id is not None:
                attrs["messaging.message.id"] = job_id
            if count != 1:
                attrs["messaging.batch.message_count"] = count
            span = self.tracer.start_span(
                f"create {queue}", kind=self._kinds.PRODUCER, attributes=attrs,
                context=self._parent({TRACE_KEY: parent}) if parent else None)
            entry = self._inject(span)
        except Exception:  # noqa: BLE001 - tracing never fails an enqueue
            log.debug("tracing: create span failed", exc_info=True)
        try:
            result = await send(entry)
        except BaseException as exc:
            self._finish(span, exc)
            raise
        self._finish(span, None)
        return result

    def idle(self) -> bool:
        """Whether a span made now would be a no-op that carries nothing: no provider given,
        none set globally (so no SDK records anything), and no valid span current (whose
        context a no-op span would still pass on). Then an enqueue skips the span's work
        (about 4 us of an in-process enqueue's 22 here). Never raises."""
        trace = self._trace
        try:
            return self._global and type(trace.get_tracer_provider()) is self._proxy \
                and not trace.get_current_span().get_span_context().is_valid
        except Exception:  # noqa: BLE001 - tracing never fails an enqueue
            return False

    def _inject(self, span: Any) -> dict[str, str] | None:
        if not span.get_span_context().is_valid:
            return None  # nothing traced here (no SDK, or no active trace): carry nothing
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, self._trace.set_span_in_context(span))
        return {k: carrier[k] for k in ("traceparent", "tracestate") if carrier.get(k)} or None

    # -- worker ----------------------------------------------------------------------------------
    def _parent(self, meta: dict[str, Any] | None) -> Any:
        """The producer's context a job carries; None when it carries none, so its spans
        start a trace of their own (never one the worker happens to be in)."""
        entry = (meta or {}).get(TRACE_KEY)
        if not isinstance(entry, dict):
            return None
        return self._propagator.extract({k: v for k, v in entry.items()
                                         if isinstance(v, str)})

    def received(self, queue: str, jobs: list[Any], round_trip_s: float) -> None:
        """One ended ``receive`` span per claimed job that carries a trace context, over the
        claim's round trip."""
        try:
            # Span timestamps are OpenTelemetry's wall-clock nanoseconds (as its SDK stamps the
            # spans it starts), not engine timing: the simulator never turns tracing on.
            end = time.time_ns()
            start = end - int(max(0.0, round_trip_s) * 1e9)
            for job in jobs:
                parent = self._parent(job.meta)
                if not parent:
                    continue  # an untraced producer's job: its process span starts a trace
                self._parents[job.token] = parent
                if len(self._parents) > MAX_OPEN_SETTLES:  # (jobs handed back unrun)
                    self._parents.popitem(last=False)
                span = self.tracer.start_span(
                    f"receive {queue}", context=parent,
                    kind=self._kinds.CONSUMER, start_time=start,
                    attributes=_job_attrs(queue, "receive", "claim", job))
                _SINK.end(span, end)
        except Exception:  # noqa: BLE001
            log.debug("tracing: receive spans failed", exc_info=True)

    async def process(self, queue: str, job: Any,
                      run: Coroutine[Any, Any, dict[str, Any] | None]
                      ) -> dict[str, Any] | None:
        """Await ``run`` (one attempt: it returns the ack/nack to send) inside a ``process``
        span made current; then open the attempt's ``settle`` span. Raises what ``run``
        raises."""
        span = token = None
        try:
            span = self.tracer.start_span(
                f"process {queue}", context=self._parents.pop(job.token, None)
                or self._parent(job.meta) or self._context.Context(),
                kind=self._kinds.CONSUMER,
                attributes=_job_attrs(queue, "process", "process", job))
            token = self._context.attach(self._trace.set_span_in_context(span))
        except Exception:  # noqa: BLE001
            log.debug("tracing: process span failed", exc_info=True)
        try:
            outcome = await run
        except BaseException as exc:
            self._detach(token)
            self._finish(span, exc)
            raise
        self._detach(token)
        error = outcome.get("error") if outcome and outcome.get("op") == "nack" else None
        self._finish(span, None, error)
        if outcome is not None and span is not None:
            self._open_settle(queue, job, span, outcome)
        return outcome

    def _open_settle(self, queue: str, job: Any, parent: Any, outcome: dict[str, Any]) -> None:
        try:
            op = str(outcome.get("op"))
            span = self.tracer.start_span(
                f"settle {queue}", context=self._trace.set_span_in_context(parent),
                kind=self._kinds.CLIENT, attributes=_job_attrs(queue, "settle", op, job))
            self._settles[str(outcome["token"])] = span
            while len(self._settles) > MAX_OPEN_SETTLES:
                _, old = self._settles.popitem(last=False)
                _SINK.end(old, time.time_ns())
        except Exception:  # noqa: BLE001
            log.debug("tracing: settle span failed", exc_info=True)

    def settled(self, items: list[dict[str, Any]], statuses: list[str] | None) -> None:
        """End the ``settle`` spans of ``items`` with the owner's ``statuses`` (None: the
        request failed)."""
        try:
            for i, item in enumerate(items):
                span = self._settles.pop(str(item.get("token")), None)
                if span is None:
                    continue
                status = statuses[i] if statuses is not None and i < len(statuses) \
                    else "failed"
                span.set_attribute("istos.settle.status", status)
                if status != "ok":
                    span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, status))
                _SINK.end(span, time.time_ns())
        except Exception:  # noqa: BLE001
            log.debug("tracing: ending settle spans failed", exc_info=True)

    # -- shared ----------------------------------------------------------------------------------
    def _detach(self, token: Any) -> None:
        if token is not None:
            with contextlib.suppress(Exception):
                self._context.detach(token)

    def _finish(self, span: Any, exc: BaseException | None, error: str | None = None) -> None:
        if span is None:
            return
        try:
            if exc is not None:
                span.set_attribute("error.type", type(exc).__name__)
                span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, str(exc)))
            elif error is not None:
                span.set_attribute("error.type", error.split(":", 1)[0])
                span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, error))
            _SINK.end(span, time.time_ns())
        except Exception:  # noqa: BLE001
            log.debug("tracing: ending a span failed", exc_info=True)


def _attrs(queue: str, op_type: str, op_name: str) -> dict[str, Any]:
    return {"messaging.system": SYSTEM, "messaging.operation.type": op_type,
            "messaging.operation": op_type,  # the name older conventions (and backends) read
            "messaging.operation.name": op_name, "messaging.destination.name": queue}


def _job_attrs(queue: str, op_type: str, op_name: str, job: Any) -> dict[str, Any]:
    attrs = _attrs(queue, op_type, op_name)
    attrs["messaging.message.id"] = job.job_id
    attrs["istos.job.attempt"] = job.attempt  # 1 on the first attempt
    attrs["messaging.client.id"] = job.worker
    return attrs


class _SpanSink:
    """Ends spans on one daemon thread, so processors and exporters never run on the event
    loop; bounded by :data:`MAX_PENDING_SPANS` (past it, spans are dropped)."""

    def __init__(self) -> None:
        self._queue: queue_mod.Queue[tuple[Any, int] | threading.Event] = \
            queue_mod.Queue(MAX_PENDING_SPANS)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.dropped = 0

    def end(self, span: Any, end_ns: int) -> None:
        if not span.is_recording():
            return  # nothing to export (a no-op tracer): nothing to hand over
        self._start()
        try:
            self._queue.put_nowait((span, end_ns))
        except queue_mod.Full:
            self.dropped += 1

    def flush(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the spans handed over so far to be ended."""
        if self._thread is None:
            return True
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout_s)
        except queue_mod.Full:
            return False
        return done.wait(timeout_s)

    def _start(self) -> None:
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="istos-spans",
                                                    daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if isinstance(item, threading.Event):
                item.set()
                continue
            span, end_ns = item
            try:
                span.end(end_time=end_ns)
            except Exception:  # noqa: BLE001 - an exporter's failure is never the job's
                log.debug("tracing: a span processor or exporter raised", exc_info=True)


_SINK = _SpanSink()


def flush(timeout_s: float = 5.0) -> bool:
    """Wait up to ``timeout_s`` seconds until every span this process's apps ended so far
    went through the tracer provider's processors (blocking; for tests and shutdown). Returns
    whether it finished in time. Never raises."""
    return _SINK.flush(timeout_s)


def dropped_spans() -> int:
    """How many spans this process dropped because the span queue was full (a stuck
    exporter). Never raises."""
    return _SINK.dropped
