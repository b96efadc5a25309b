"""OpenTelemetry tracing (``Istos(tracing=...)``, ``istos.tracing``): the producer's trace
context rides in the job's meta; the worker's receive/process/settle spans join the
producer's trace, one process span per attempt; chains and batches continue the trace; an
exporter that raises or hangs never delays or fails a job. End-to-end over real Zenoh on a
private loopback mesh, spans caught by the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from helpers import count, wait_events
from zenoh_util import isolated_configs, unique_prefix

from istos import ConfigError, InvalidJob, Istos, protocol
from istos.errors import ProtocolError

otel_sdk = pytest.importorskip("opentelemetry.sdk.trace")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import (  # noqa: E402
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

from istos import tracing  # noqa: E402

WAIT_S = 60.0
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def provider() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp, exporter


def spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    assert tracing.flush(10.0)
    return [s for s in exporter.get_finished_spans() if s.name == name]


def trio(tp: Any, **queue: Any) -> tuple[Istos, Istos, Istos]:
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner", tracing=False)
    for name in ("jobs", "next"):
        owner.queue(name, retry_backoff_s=0.01, retry_jitter=0.0, **queue)
    producer = Istos(zenoh=configs[1], prefix=prefix, node_id="prod", tracing=tp)
    worker = Istos(zenoh=configs[2], prefix=prefix, node_id="wk", tracing=tp)
    return owner, producer, worker


async def test_one_job_with_two_attempts_is_one_trace_enqueue_receive_process_settle():
    tp, exporter = provider()
    owner, producer, worker = trio(tp)
    tracer = tp.get_tracer("test")

    @worker.worker("jobs", poll_interval_s=0.05)
    async def flaky(data: Any, ctx: Any) -> str:
        with tracer.start_as_current_span("inside"):
            if ctx.attempt == 1:
                raise RuntimeError("first attempt fails")
        return "ok"

    async with owner.serving(), producer.serving(), worker.serving():
        with tracer.start_as_current_span("request") as request:
            job_id = await producer.enqueue("jobs", {"n": 1})
        await wait_events(owner, lambda es: count(es, "acked", job_id) == 1, WAIT_S)
        # The owner stores the context in the job's meta, as W3C traceparent.
        rec = owner.owners["jobs"].state.jobs.get(job_id)
        assert rec is None or set(rec.meta or {}) == {"trace"}

    (create,) = spans(exporter, "create jobs")
    assert create.parent is not None and create.parent.span_id == request.get_span_context(
        ).span_id
    assert create.kind is SpanKind.PRODUCER
    assert create.attributes is not None
    assert {"messaging.system": "istos", "messaging.operation.type": "create",
            "messaging.destination.name": "jobs",
            "messaging.message.id": job_id}.items() <= dict(create.attributes).items()
    trace_id = create.context.trace_id
    process = sorted(spans(exporter, "process jobs"),
                     key=lambda s: s.attributes["istos.job.attempt"])  # type: ignore[index]
    receive = spans(exporter, "receive jobs")
    settle = spans(exporter, "settle jobs")
    assert len(process) == len(receive) == len(settle) == 2
    for span in [*process, *receive]:  # every attempt: in the producer's trace, under create
        assert span.context.trace_id == trace_id
        assert span.parent is not None and span.parent.span_id == create.context.span_id
        assert span.kind is SpanKind.CONSUMER
        assert span.attributes is not None
        assert span.attributes["messaging.message.id"] == job_id
        assert span.attributes["messaging.destination.name"] == "jobs"
    assert [s.attributes["istos.job.attempt"] for s in process] == [1, 2]  # type: ignore[index]
    assert process[0].status.status_code is StatusCode.ERROR
    assert process[0].attributes["error.type"] == "RuntimeError"  # type: ignore[index]
    assert process[1].status.status_code is not StatusCode.ERROR
    ops = {s.parent.span_id: s.attributes["messaging.operation.name"]  # type: ignore[union-attr,index]
           for s in settle}
    assert ops == {process[0].context.span_id: "nack", process[1].context.span_id: "ack"}
    assert all(s.kind is SpanKind.CLIENT and s.attributes["istos.settle.status"] == "ok"
               for s in settle)  # type: ignore[index]
    # The function's own spans nest under its attempt's process span.
    inside = spans(exporter, "inside")
    assert {s.parent.span_id for s in inside} == {p.context.span_id  # type: ignore[union-attr]
                                                  for p in process}


async def test_a_chain_continues_the_trace_and_batches_carry_the_context():
    tp, exporter = provider()
    owner, producer, worker = trio(tp)
    tracer = tp.get_tracer("test")

    @worker.worker("jobs", poll_interval_s=0.05, concurrency=4)
    def step(data: Any) -> Any:  # a plain function: runs on a thread, in the span's context
        with tracer.start_as_current_span("sync inside"):
            return data

    @worker.worker("next", poll_interval_s=0.05)
    async def last(data: Any) -> Any:
        return data

    async with owner.serving(), producer.serving(), worker.serving():
        first = await producer.chain(["jobs", "next"], {"n": 1})
        batch = await producer.enqueue_many("jobs", [1, 2, 3])
        gathered = await asyncio.gather(*(producer.enqueue("jobs", i) for i in range(4)))
        done = {first.rsplit(".", 1)[0] + ".1", *batch, *gathered}
        await wait_events(owner, lambda es: all(count(es, "acked", j) for j in done)
                          and count(es, "acked", first) == 1, WAIT_S)

    creates = {s.context.span_id: s for s in spans(exporter, "create jobs")}
    (next_create,) = spans(exporter, "create next")
    process = {s.attributes["messaging.message.id"]: s  # type: ignore[index]
               for s in spans(exporter, "process jobs") + spans(exporter, "process next")}
    # The chain: step 1 is enqueued inside step 0's process span, so one trace throughout.
    step0, step1 = process[first], process[first.rsplit(".", 1)[0] + ".1"]
    assert next_create.parent is not None and next_create.parent.span_id == step0.context.span_id
    assert step1.parent is not None and step1.parent.span_id == next_create.context.span_id
    assert step0.context.trace_id == step1.context.trace_id
    # The batch: one create span, its jobs' attempts all under it.
    (batch_span,) = [s for s in creates.values()
                     if s.attributes.get("messaging.batch.message_count") == 3]  # type: ignore[union-attr]
    assert {process[j].parent.span_id for j in batch} == {  # type: ignore[union-attr]
        batch_span.context.span_id}
    # Concurrent enqueues travel as one request, each job still under its own create span.
    assert all(process[j].parent.span_id in creates for j in gathered)  # type: ignore[union-attr]
    assert len({process[j].parent.span_id for j in gathered}) == 4  # type: ignore[union-attr]
    assert {s.parent.span_id for s in spans(exporter, "sync inside")} <= {  # type: ignore[union-attr]
        p.context.span_id for p in process.values()}


class RaisingExporter(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        raise RuntimeError("collector down")


class StuckExporter(SpanExporter):
    def __init__(self) -> None:
        self.release = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.release.wait(30)
        return SpanExportResult.SUCCESS


@pytest.mark.parametrize("kind", ["raises", "stuck"])
async def test_an_exporter_that_raises_or_hangs_neither_fails_nor_delays_jobs(kind):
    exporter = RaisingExporter() if kind == "raises" else StuckExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    owner, producer, worker = trio(tp)

    @worker.worker("jobs", poll_interval_s=0.05)
    async def work(data: Any) -> Any:
        return data

    try:
        async with owner.serving(), producer.serving(), worker.serving():
            ids = [await producer.enqueue("jobs", i) for i in range(5)]
            # With a stuck exporter every job still runs and acks on its first attempt.
            events = await wait_events(
                owner, lambda es: all(count(es, "acked", j) == 1 for j in ids), WAIT_S)
            assert count(events, "nacked") == 0
    finally:
        if isinstance(exporter, StuckExporter):
            exporter.release.set()
    assert tracing.flush(30.0)


async def test_a_hostile_trace_entry_is_refused_by_the_owner_and_tracing_off_adds_none():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner", tracing=False)
    owner.queue("jobs")
    producer = Istos(zenoh=configs[1], prefix=prefix, node_id="prod", tracing=False)
    assert producer.node.tracing is None
    async with owner.serving(), producer.serving():
        with pytest.raises(InvalidJob, match="traceparent"):
            await producer.producer.enqueue("jobs", 1, _meta={"trace": {"traceparent": "x"}})
        ok = await producer.producer.enqueue(
            "jobs", 1, _meta={"trace": {"traceparent": TRACEPARENT}})
        plain = await producer.enqueue("jobs", 2)
        jobs = owner.owners["jobs"].state.jobs
        assert jobs[ok].meta == {"trace": {"traceparent": TRACEPARENT}}
        assert jobs[plain].meta is None


@pytest.mark.fast
def test_the_trace_entry_is_bounded_and_batches_carry_nothing_else():
    protocol.meta("meta", {"trace": {"traceparent": TRACEPARENT, "tracestate": "a=b"}})
    for bad in ({"traceparent": TRACEPARENT.upper()}, {"traceparent": TRACEPARENT, "x": 1},
                {"traceparent": TRACEPARENT, "tracestate": "a" * 513},
                {"traceparent": TRACEPARENT, "tracestate": "\n"}, "00-", {}):
        with pytest.raises(ProtocolError, match=r"meta\.trace"):
            protocol.meta("meta", {"trace": bad})
    item = {"body": b"\x01", "job_id": "j1", "meta": {"trace": {"traceparent": TRACEPARENT}}}
    protocol.enqueue_item("items[0]", item)
    with pytest.raises(ProtocolError, match="no job meta but a trace context"):
        protocol.enqueue_item("items[0]", {**item, "meta": {"chain": {}}})
    with pytest.raises(ConfigError, match="TracerProvider"):
        Istos(tracing="yes")


def test_the_engine_imports_no_opentelemetry_when_tracing_is_off():
    code = ("import sys; from istos import Istos; Istos(tracing=False); "
            "assert not [m for m in sys.modules if m.startswith('opentelemetry')]")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


async def test_a_sync_producer_puts_its_callers_trace_into_the_job():
    from istos import SyncProducer

    tp, exporter = provider()
    tracer = tp.get_tracer("test")
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner", tracing=False)
    owner.queue("jobs")
    worker = Istos(zenoh=configs[1], prefix=prefix, node_id="wk", tracing=tp)

    @worker.worker("jobs", poll_interval_s=0.05)
    async def work(data: Any) -> None:
        return None

    def produce() -> tuple[str, int]:
        with SyncProducer(configs[2], prefix=prefix, request_timeout_s=20, tracing=tp) as sp, \
                tracer.start_as_current_span("script") as script:
            return sp.enqueue("jobs", 1), script.get_span_context().trace_id

    async with owner.serving(), worker.serving():
        job_id, trace_id = await asyncio.to_thread(produce)
        await wait_events(owner, lambda es: count(es, "acked", job_id) == 1, WAIT_S)
    (create,) = spans(exporter, "create jobs")
    (process,) = spans(exporter, "process jobs")
    assert create.context.trace_id == process.context.trace_id == trace_id
    assert process.parent is not None and process.parent.span_id == create.context.span_id


async def test_a_job_from_an_untraced_producer_starts_its_own_trace_at_process():
    tp, exporter = provider()
    owner, producer, worker = trio(tp)
    producer.node.tracing = producer.producer.tracing = None  # as an app built without it

    @worker.worker("jobs", poll_interval_s=0.05)
    async def work(data: Any) -> None:
        return None

    with tp.get_tracer("test").start_as_current_span("serving"):
        async with owner.serving(), producer.serving(), worker.serving():
            job_id = await producer.enqueue("jobs", 1)
            await wait_events(owner, lambda es: count(es, "acked", job_id) == 1, WAIT_S)
    assert spans(exporter, "receive jobs") == [] and spans(exporter, "create jobs") == []
    (process,) = spans(exporter, "process jobs")
    assert process.parent is None  # a root, not a child of whatever the worker ran in
    (settle,) = spans(exporter, "settle jobs")
    assert settle.parent is not None and settle.parent.span_id == process.context.span_id


async def test_a_chords_callback_continues_the_trace_of_its_members():
    tp, exporter = provider()
    owner, producer, worker = trio(tp)
    tracer = tp.get_tracer("test")

    @worker.worker("jobs", poll_interval_s=0.05, concurrency=2)
    async def member(data: Any) -> Any:
        return data * 2

    @worker.worker("next", poll_interval_s=0.05)
    async def callback(data: Any) -> Any:
        return sum(data["results"])

    async with owner.serving(), producer.serving(), worker.serving():
        with tracer.start_as_current_span("request") as request:
            chord_id = await producer.chord("jobs", [1, 2], callback=("next", None))
        await wait_events(owner, lambda es: count(es, "acked", f"{chord_id}.callback") == 1,
                          WAIT_S)
    trace_id = request.get_span_context().trace_id
    (cb,) = spans(exporter, "process next")
    members = spans(exporter, "process jobs")
    assert len(members) == 2
    assert {s.context.trace_id for s in [cb, *members]} == {trace_id}
    # The owner (which does not trace here) passed on the last member's context.
    creates = {s.context.span_id for s in spans(exporter, "create jobs")}
    assert cb.parent is not None and cb.parent.span_id in creates


def test_an_enqueue_skips_the_span_only_when_it_would_be_a_no_op_carrying_nothing():
    """In a fresh process (no provider set globally): Tracing(None) is idle, and its enqueue
    carries nothing; with a valid span current (context propagated, no SDK) it is not idle
    and the job carries that trace; once a provider is set globally, or with an app's own
    provider, it is never idle."""
    code = """
import asyncio
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from istos.tracing import Tracing

t = Tracing(None)
assert t.idle()
carried = []
async def send(entry):
    carried.append(entry)
    return "id"
assert asyncio.run(t.enqueue("q", "j", 1, send)) == "id" and carried == [None]
ctx = SpanContext(trace_id=0x1234, span_id=0x99, is_remote=True,
                  trace_flags=TraceFlags(TraceFlags.SAMPLED))
with trace.use_span(NonRecordingSpan(ctx)):
    assert not t.idle()
    asyncio.run(t.enqueue("q", "j", 1, send))
assert carried[1] and carried[1]["traceparent"].startswith("00-" + format(0x1234, "032x"))
assert not Tracing(TracerProvider()).idle()
trace.set_tracer_provider(TracerProvider())
assert not t.idle()
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
