"""The worker side: claim jobs into free slots, run the user's function, ack or nack.

One dispatcher per ``@app.worker`` claims as many jobs as it has free slots in a single request
(a batch), so a busy worker pays one claim round trip per batch rather than per job. When the
queue has nothing for it, the dispatcher sleeps until the owner's nudge (one wake-up for the whole
worker, however many slots are idle: the reference package woke every idle loop per job) or the
poll interval, a safety net for missed nudges and elapsed delays.

A slot is free as soon as its function returns: the ack (or nack) goes into an outbox that rides
on the next claim, or leaves in one batched ``settle`` request at the end of the loop turn. Acks
are idempotent (keyed by the lease token), so a lost one costs a redelivery, never a job.

Shutdown: the dispatcher stops claiming; jobs in flight get ``shutdown_grace_s`` to finish and
ack; any still running after that (and prefetched jobs not started) are cancelled *without* a
nack and handed back in one ``release`` request: ready again at once, their attempt not counted
(a nack, or waiting for the lease to expire, would burn an attempt for a job that did nothing
wrong). If the owner cannot take the release, they come back when their lease expires. The
acks and the release still unsent when the grace ends get one request timeout in all (a stop
while no owner answers is not held for a timeout per try).

Heartbeats, ``timeout_s`` and cancellation live in ``heartbeat.py`` (:class:`HeldLeases`): this
module tells it when a job is claimed, started and finished.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import math
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from .. import codec, di, protocol
from ..client import OwnerClient
from ..context import JobContext
from ..core.config import WorkerConfig
from ..core.expiry import start_deadline
from ..errors import InvalidJob, IstosError, OwnerUnavailable, Retry, StorageUnavailable
from ..node import Node
from ..wakeup import Wakeup
from . import joblog
from .heartbeat import Held, HeldLeases
from .parking import ClaimParking
from .waiting import WaitingJobs

log = logging.getLogger("istos.worker")

SETTLE_ITEM_BYTES = 256  # an ack/nack's fields besides its result and logs (at most)
SETTLE_BUDGET = protocol.PAGE_BUDGET // 2  # of one request's settled items (the rest: claims)
SETTLE_TRIES = 3  # an ack is sent at least this often before its job is left to its lease
SETTLE_RETRY_FIRST_S = 0.05  # the first wait between tries; doubled each time,
SETTLE_RETRY_MAX_S = 1.0  # up to this
AUTO_PREFETCH_FACTOR = 4
"""The automatic prefetch holds at most this many times ``concurrency`` extra jobs."""

ContinueHook = Callable[[dict[str, Any], Any], Awaitable[None]]
BatchOf = Callable[["dict[str, Any] | None", str], Any]  # (meta, job id) -> ctx.batch


@dataclass
class ClaimedJob:
    job_id: str
    body: bytes
    attempt: int
    token: str
    worker: str
    deadline: float | None
    last_error: str | None
    meta: dict[str, Any] | None
    max_attempts: int
    keep_results: bool
    start_by: float | None = None  # not started by then (owner's clock): handed back unrun


@dataclass
class WorkerStats:
    claims: int = 0
    empty_claims: int = 0
    acked: int = 0
    nacked: int = 0
    failed_replies: int = 0
    not_started: int = 0  # prefetched jobs handed back (or dropped): their lease ran out waiting
    peak_held: int = 0  # most jobs held at once (running + prefetched): > concurrency = prefetch
    slot_ids: list[str] = field(default_factory=list)


class WorkerRunner:
    def __init__(self, config: WorkerConfig, fn: Callable[..., Any], node: Node,
                 client: OwnerClient, *, continue_hook: ContinueHook | None = None,
                 shutdown_grace_s: float = 10.0, batch_of: BatchOf | None = None) -> None:
        self.config = config
        self.fn = fn
        self.node = node
        self.client = client
        self.continue_hook = continue_hook
        self.batch_of = batch_of
        self.shutdown_grace_s = shutdown_grace_s
        self._deps, self._wants_ctx = di.plan(fn)
        self._is_async = inspect.iscoroutinefunction(fn)
        name = getattr(fn, "__name__", "worker")
        # One lease slot per job held: the running ones plus the prefetched ones waiting for
        # an execution slot (``_running`` caps how many run at once).
        self._auto_prefetch = config.prefetch is None
        self._max_prefetch = max(0, min(AUTO_PREFETCH_FACTOR * config.concurrency,
                                        protocol.MAX_SLOTS - config.concurrency)) \
            if config.prefetch is None else config.prefetch
        held = config.concurrency + self._max_prefetch
        self._avg_run_s: float | None = None  # moving average of the function's run time
        self._avg_claim_s: float | None = None  # moving average of a claim's round trip
        self._runs_seen = 0
        self._lease_s: float | None = None
        self.slot_ids = [f"{node.node_id}:{name}#{i}" for i in range(held)]
        self._running = asyncio.Semaphore(config.concurrency)
        self._free = list(reversed(self.slot_ids))  # pop() hands out #0 first
        self._wake = Wakeup()
        self._slot_freed = Wakeup()
        self._tasks: set[asyncio.Task[None]] = set()
        self._dispatcher: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._nudge_handle: Any = None
        self._stopping = False
        self._killed = False
        self._released: list[dict[str, Any]] = []  # jobs cancelled by shutdown, to hand back
        self._outbox: list[dict[str, Any]] = []
        # By lease token: when this worker can be sure the lease of an unsettled job ended, so
        # a refused ack is retried while it can still land (``_send_settle``).
        self._settle_by: dict[str, float] = {}
        self._flush_scheduled = False
        self._settling: set[asyncio.Task[None]] = set()
        # Set by stop(): when (node clock, monotonic) the acks and releases still unsent stop
        # being retried, so a stop with no owner answering is not held for three timeouts.
        self._wind_down_by: float | None = None
        # Prefetched jobs wait here for a slot, or go back unrun if their lease would end.
        self.waiting = WaitingJobs(self._running, node.clock, lease_s=lambda: self._lease_s,
                                   claim_rtt=lambda: self._avg_claim_s,
                                   send_release=self._send_release, tasks=self._settling)
        self.stats = WorkerStats(slot_ids=list(self.slot_ids))
        # What the owner's `workers` table shows of this runner (owner/views/workers.py).
        self._info = [held, config.concurrency,
                      -1 if config.prefetch is None else config.prefetch, int(config.heartbeat)]
        self.leases = HeldLeases(self)
        self.parking = ClaimParking(node, client, config.poll_interval_s, config.park)

    # -- lifecycle --------------------------------------------------------------------------------
    @property
    def stopping(self) -> bool:
        """True from the moment stop (or kill) began: no new runs, no renewals for ending ones."""
        return self._stopping

    @property
    def lease_s(self) -> float | None:
        """The queue's lease as the owner's last claim reply said (None before the first)."""
        return self._lease_s

    async def start(self) -> None:
        transport = self.node.transport
        if transport is not None:
            self._nudge_handle = await transport.declare_subscriber(
                self.node.key(self.config.queue, "nudge"), self._on_remote_nudge)
        await self.leases.start()
        self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch_loop())

    def on_nudge(self) -> None:
        """Jobs became claimable: wake the dispatcher if it has a free slot."""
        if self._free:
            self._wake.set()

    def _on_remote_nudge(self, key: str, payload: bytes) -> None:
        try:
            msg = codec.decode_message(payload)
        except IstosError:
            return
        targets = msg.get("to")
        if targets is None or self.node.node_id in targets:
            self.on_nudge()

    async def stop(self) -> None:
        self._stopping = True
        if self._nudge_handle is not None:
            self._nudge_handle.close()
        if self._dispatcher is not None:
            await self.parking.stop(self._dispatcher, self.parking.poll_s
                                    + self.node.request_timeout_s)
            self._dispatcher.cancel()
            await asyncio.gather(self._dispatcher, return_exceptions=True)
        if self._tasks:
            _, pending = await asyncio.wait(
                set(self._tasks), timeout=self.node.clock.to_loop_seconds(self.shutdown_grace_s))
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self.leases.stop()
        # The acks and releases still to send get one request timeout in all, however many
        # tries they have left: past it their jobs are left to their leases (they come back;
        # nothing is lost).
        self._wind_down_by = self.node.clock.monotonic() + self.node.request_timeout_s
        self._flush_outbox()  # finished jobs' acks still go out before we leave
        if self._settling:
            await asyncio.gather(*self._settling, return_exceptions=True)
        if self._released:
            items, self._released = self._released, []
            await self._send_release(items)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def kill(self) -> None:
        """Stop at once with no ack, no nack (a simulated crash)."""
        self._stopping = True
        self._killed = True
        if self._nudge_handle is not None:
            self._nudge_handle.close()
        if self._dispatcher is not None:
            self._dispatcher.cancel()
        for task in self._tasks:
            task.cancel()
        for task in self._settling:
            task.cancel()
        self.leases.kill()
        self._settle_by.clear()
        self._outbox.clear()  # a crash loses unsent acks: those jobs come back after the lease

    # -- claiming ---------------------------------------------------------------------------------
    async def _dispatch_loop(self) -> None:
        clock, poll = self.node.clock, self.config.poll_interval_s
        while not self._stopping:
            slots = self._claimable_slots()
            if not slots:
                self._slot_freed.clear()
                await self._slot_freed.wait(None)
                continue
            self._wake.clear()
            try:
                jobs = await self._claim(slots)
            except (OwnerUnavailable, IstosError) as exc:
                log.debug("worker %s: claim failed: %s", slots[0], exc)
                jobs = []
            if len(jobs) < len(slots):
                # The queue had nothing more for us: claim again at once if the claim waited
                # at the owner (parked), else sleep until a nudge or the poll interval.
                wait = self.parking.wait_after_short_claim(
                    poll, holding=len(self._free) < len(self.slot_ids))
                if wait is not None:
                    await self._wake.wait(clock.to_loop_seconds(wait))

    def _claimable_slots(self) -> list[str]:
        """The free slots to claim for: running slots plus the prefetch allowed right now."""
        held = len(self.slot_ids) - len(self._free)
        budget = self.config.concurrency + self._prefetch_now() - held
        return list(reversed(self._free))[:max(0, budget)]

    def _prefetch_now(self) -> int:
        """Automatic prefetch holds extra jobs only while jobs are very short next to the
        lease (under 1% of it), so it hides claim round trips for short jobs and never puts a
        long job's lease at risk.

        How many: ``concurrency``, or more when a claim's round trip is longer than a job
        (enough to keep every slot busy for one round trip: ``concurrency * rtt / run``), up
        to ``AUTO_PREFETCH_FACTOR * concurrency`` and to what would make a prefetched job
        wait past 1% of its lease (it waits about ``prefetch / concurrency`` run times).
        """
        if not self._auto_prefetch:
            return int(self.config.prefetch or 0)
        run, lease = self._avg_run_s, self._lease_s
        if self._runs_seen < 8 or run is None or lease is None or run > lease / 100:
            return 0
        conc = self.config.concurrency
        rtt = self._avg_claim_s or 0.0
        run = max(run, 1e-6)
        depth = math.ceil(conc * rtt / run)
        waiting_cap = math.floor(conc * lease / (100 * run) + 1e-9)  # (1e-9: float noise)
        return max(conc, min(depth, self._max_prefetch, waiting_cap))

    def _take_outbox(self) -> list[dict[str, Any]]:
        """The outbox's acks/nacks that fit one request (results, tracebacks and ctx.log()
        lines are large: the rest wait for the next request)."""
        box = self._outbox
        used, n = 0, 0
        for item in box:
            size = SETTLE_ITEM_BYTES + len(item.get("result") or b"") \
                + 4 * len(item.get("traceback") or "") \
                + protocol.MAX_LOG_LINE_BYTES * len(item.get("logs") or ())
            if n and used + size > SETTLE_BUDGET:
                break
            used, n = used + size, n + 1
        if n == len(box):
            self._outbox = []
            return box
        self._outbox = box[n:]
        return box[:n]

    async def _claim(self, slots: list[str]) -> list[ClaimedJob]:
        settle = self._take_outbox()
        fields: dict[str, Any] = {"workers": slots, "node": self.node.node_id,
                                  "wi": self._info}
        if settle:
            fields["settle"] = settle
        park_s = self.parking.park_s()
        if park_s > 0:
            fields["park_s"], fields["park_key"] = park_s, self.parking.key
        timeout_s = self.parking.begin(slots, park_s)
        sent_at = self.node.clock.monotonic()
        try:
            reply = await self.client.call("claim", timeout_s, **fields)
        except IstosError:
            self.parking.end(None)
            if settle:  # the acks did not get through: send them on their own, with retries
                self._outbox[:0] = settle
                self._schedule_flush()
            raise
        self.parking.end(reply)
        self.stats.claims += 1
        if not reply.get("parked"):  # a parked claim's time is mostly waiting, not the trip
            self._avg_claim_s = _moving_average(self._avg_claim_s,
                                                self.node.clock.monotonic() - sent_at)
        self._lease_s = reply.get("lease_s", self._lease_s)
        if settle:
            self._count(settle, reply.get("settled") or [])
            self._settled(settle)
        jobs = [ClaimedJob(j["job_id"], j["body"], j["attempt"], j["token"], j["worker"],
                           j.get("deadline"), j.get("last_error"), j.get("meta"),
                           reply["max_attempts"], reply["keep_results"],
                           start_deadline(j.get("start_by")))
                for j in reply["jobs"]]
        if not jobs:
            self.stats.empty_claims += 1
        elif self.node.tracing is not None:
            self.node.tracing.received(self.config.queue, jobs,
                                       self.node.clock.monotonic() - sent_at)
        loop = asyncio.get_running_loop()
        granted = sent_at + _waited(reply, park_s)
        for job in jobs:
            held = self.leases.hold(job, granted, self._lease_s)
            self._free.remove(job.worker)
            task = held.runner_task = loop.create_task(self._run(job, held))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        holding = len(self.slot_ids) - len(self._free)
        if holding > self.stats.peak_held:
            self.stats.peak_held = holding
        if reply.get("cancel"):
            self.leases.cancel(reply["cancel"])
        return jobs

    # -- running one job --------------------------------------------------------------------------
    async def _run(self, job: ClaimedJob, held: Held) -> None:
        outcome: dict[str, Any] | None = None
        try:
            if not await self.waiting.take_slot(held):
                # Its lease would end before a slot frees: hand it back while the owner still
                # counts it as ours, so the attempt it never started is not used up (a job
                # cancelled meanwhile is nacked as cancelled instead, so it ends).
                self.stats.not_started += 1
                if held.cancel_requested:
                    outcome = {"job_id": job.job_id, "token": job.token, "op": "nack",
                               "error": "JobCancelled: cancelled before it started"}
                else:
                    self.waiting.hand_back(job.job_id, job.token)
                return
            try:  # FIFO: prefetched jobs start in claim order
                now = self.node.clock.monotonic()
                verdict = self._verdict(job, held, now)
                if verdict == "run":
                    run = self._run_job(job, held, now)
                    tracing = self.node.tracing  # istos.tracing: spans of this attempt
                    outcome = await (run if tracing is None
                                     else tracing.process(self.config.queue, job, run))
                else:  # never start a job whose lease ended (or that was cancelled) meanwhile
                    outcome = self._not_started(job, verdict)
            finally:
                self._running.release()
        except asyncio.CancelledError:
            if self._stopping and not self._killed:  # shutdown, not a crash: hand it back
                self._released.append({"job_id": job.job_id, "token": job.token})
            raise
        finally:
            self.leases.finish(held, outcome)  # the latest progress rides along
            self._free.append(job.worker)
            self._slot_freed.set()
            if self.parking.park_again(len(self._free) == len(self.slot_ids)):
                self._wake.set()  # idle again: park a claim at once, this ack riding on it
            if outcome is not None:
                self._settle_by[job.token] = held.expires
                # Queued after the slot is freed, so a dispatcher woken by the free slot takes
                # the ack along with its claim; otherwise it leaves at the end of this turn.
                self._outbox.append(outcome)
                self._schedule_flush()

    def _verdict(self, job: ClaimedJob, held: Held, now: float) -> str:
        """The lease's verdict (``heartbeat.py``), or ``too_late`` for a job whose start
        deadline passed while it waited here (by this node's clock)."""
        verdict = self.leases.verdict(held, now)
        if verdict == "run" and job.start_by is not None \
                and self.node.clock.now() >= job.start_by:
            return "too_late"
        return verdict

    def _not_started(self, job: ClaimedJob, verdict: str) -> dict[str, Any] | None:
        """Count and log a job not started; the nack to send for a cancelled one. A job too
        late for its start deadline is handed back unrun (the owner ends it ``expired``)."""
        self.stats.not_started += 1
        joblog.not_started(self.config.queue, job, verdict)
        if verdict == "too_late":
            self.waiting.hand_back(job.job_id, job.token)
        elif verdict == "cancelled":
            return {"job_id": job.job_id, "token": job.token, "op": "nack",
                    "error": "JobCancelled: cancelled before it started"}
        return None

    async def _run_job(self, job: ClaimedJob, held: Held, started: float) -> dict[str, Any]:
        """Run the function; return the ack or nack to send (raise on crash or shutdown)."""
        try:
            data = self.node.payload.decode_body(job.body)
            kwargs: dict[str, Any] = {}
            if self._wants_ctx:
                kwargs["ctx"] = JobContext(job.job_id, self.config.queue, job.attempt,
                                           job.max_attempts, job.last_error, job.worker,
                                           job.deadline, self.leases.signals_of(held),
                                           batch=self.batch_of(job.meta, job.job_id)
                                           if job.meta and self.batch_of else None)
            if self._deps:
                async with AsyncExitStack() as stack:
                    kwargs.update(await di.resolve(self._deps, stack, {}))
                    result = await self.leases.guard(held, self._call(data, kwargs), started)
            elif self._is_async:  # the function's own coroutine: no wrapper frame per job
                result = await self.leases.guard(held, self.fn(data, **kwargs), started)
            else:
                result = await self.leases.guard(held, self._call(data, kwargs), started)
            self._note_run_time(self.node.clock.monotonic() - started)
            if self.continue_hook is not None and job.meta:
                await self.continue_hook(job.meta, result)
            # Chord members report their result to the barrier even without keep_results.
            wants_result = job.keep_results or bool(job.meta and "chord" in job.meta)
            encoded = self.node.payload.encode_body(result, queue=self.config.queue) \
                if wants_result else None
        except asyncio.CancelledError:
            raise  # crash or shutdown: no ack, no nack; the lease brings the job back
        except InvalidJob as exc:
            error = f"result not storable: {exc}"
            joblog.failed(self.config.queue, job, error, exc)
            return {"job_id": job.job_id, "token": job.token, "op": "nack", "error": error}
        except Retry as exc:  # the worker chose the wait (a 429's Retry-After), not the curve
            after = min(exc.after_s, protocol.MAX_DELAY_S)
            error = f"Retry: {exc.reason or 'retry requested'}"
            joblog.retry_asked(self.config.queue, job, after, error)
            return {"job_id": job.job_id, "token": job.token, "op": "nack", "error": error,
                    "retry_after": after}
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            joblog.failed(self.config.queue, job, error, exc)
            return {"job_id": job.job_id, "token": job.token, "op": "nack",
                    "error": error, "traceback": _traceback(exc)}
        joblog.done(self.config.queue, job)
        if encoded is not None:
            return {"job_id": job.job_id, "token": job.token, "op": "ack", "result": encoded}
        return {"job_id": job.job_id, "token": job.token, "op": "ack"}

    def _note_run_time(self, seconds: float) -> None:
        self._runs_seen += 1
        self._avg_run_s = _moving_average(self._avg_run_s, seconds)

    async def _call(self, data: Any, kwargs: dict[str, Any]) -> Any:
        if self._is_async:
            return await self.fn(data, **kwargs)
        run = self.node.run_sync or self._run_on_pool
        if self.node.tracing is not None:  # the thread sees the job's span as current
            context = contextvars.copy_context()
            return await run(lambda: context.run(self.fn, data, **kwargs))
        return await run(lambda: self.fn(data, **kwargs))

    async def _run_on_pool(self, call: Callable[[], Any]) -> Any:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.config.concurrency,
                                                thread_name_prefix="istos-worker")
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    # -- settling acks and nacks --
    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_outbox)

    def _flush_outbox(self) -> None:
        self._flush_scheduled = False
        while self._outbox:  # (empty: a claim took them along)
            items = self._take_outbox()
            task = asyncio.get_running_loop().create_task(self._send_settle(items))
            self._settling.add(task)
            task.add_done_callback(self._settling.discard)

    async def _send_settle(self, items: list[dict[str, Any]]) -> None:
        """Send acks/nacks in one request, retried (they are idempotent, keyed by token) with
        backoff for as long as one of their leases surely lasts: a storage outage or an owner
        failover shorter than that costs no redelivery of a job that already ran. Past it (or
        at shutdown) three tries; then the jobs are left to their leases: they come back,
        nothing is lost. A stopping worker's tries end with its wind-down (:meth:`stop`)."""
        clock = self.node.clock
        until = max((self._settle_by.get(item["token"], 0.0) for item in items), default=0.0)
        attempt, delay = 0, SETTLE_RETRY_FIRST_S
        while (budget := self._wind_down_left()) is None or budget > 0:
            attempt += 1
            try:
                reply = await self.client.call("settle", timeout_s=budget, items=items)
            except (OwnerUnavailable, StorageUnavailable) as exc:
                left = until - clock.monotonic()
                if attempt >= SETTLE_TRIES and (left <= 0 or self._stopping):
                    break
                log.warning("worker %s: settling %d job(s) failed (%s)", self.slot_ids[0],
                            len(items), exc)
                # The last try falls on the lease's end: the owner may still count it as ours.
                pause = delay if attempt < SETTLE_TRIES else min(delay, max(left, 0))
                to_stop = self._wind_down_left()
                await clock.sleep(pause if to_stop is None else min(pause, max(0.0, to_stop)))
                delay = min(delay * 2, SETTLE_RETRY_MAX_S)
                continue
            except IstosError as exc:
                log.error("worker %s: owner refused %d ack(s)/nack(s): %s", self.slot_ids[0],
                          len(items), exc)
                break
            self._count(items, reply.get("statuses") or [])
            self._settled(items)
            return
        log.warning("worker %s: gave up settling %d job(s): their leases bring them back",
                    self.slot_ids[0], len(items))
        self._settled(items)
        self._count(items, None)

    def _wind_down_left(self) -> float | None:
        """Seconds left to send acks and releases in a stop (None: not stopping)."""
        if self._wind_down_by is None:
            return None
        return self._wind_down_by - self.node.clock.monotonic()

    def _settled(self, items: list[dict[str, Any]]) -> None:
        for item in items:
            self._settle_by.pop(item["token"], None)

    async def _send_release(self, items: list[dict[str, Any]]) -> None:
        """Hand jobs back unrun (shutdown, or a lease that would end while the job waited):
        retried briefly (in a stop, within its wind-down); idempotent by token."""
        for attempt in range(3):
            budget = self._wind_down_left()
            if budget is not None and budget <= 0:
                log.warning("worker %s: %d job(s) not released: no owner answered; their "
                            "leases bring them back", self.slot_ids[0], len(items))
                return
            try:
                await self.client.call("release", timeout_s=budget, items=items)
                return
            except (OwnerUnavailable, StorageUnavailable) as exc:
                log.warning("worker %s: releasing %d job(s) failed (%s)", self.slot_ids[0],
                            len(items), exc)
                await self.node.clock.sleep(0.05 * (attempt + 1))
            except IstosError as exc:
                log.error("worker %s: owner refused releasing %d job(s): %s",
                          self.slot_ids[0], len(items), exc)
                return

    def _count(self, items: list[dict[str, Any]], statuses: list[str] | None) -> None:
        if self.node.tracing is not None:
            self.node.tracing.settled(items, statuses)
        if statuses is None:  # the owner never answered
            self.stats.failed_replies += len(items)
            return
        for item, status in zip(items, statuses):
            if status == "ok":
                if item["op"] == "ack":
                    self.stats.acked += 1
                else:
                    self.stats.nacked += 1


def _waited(reply: dict[str, Any], park_s: float) -> float:
    """How long a parked claim waited at the owner before it leased its jobs (``waited_s``),
    within what this worker asked to park: its leases start that much after the send."""
    waited = reply.get("waited_s")
    if not reply.get("parked") or isinstance(waited, bool) \
            or not isinstance(waited, int | float) or not math.isfinite(waited):
        return 0.0
    return min(max(float(waited), 0.0), park_s)


def _traceback(exc: BaseException) -> str:
    """The failure's traceback as Python prints it, cut on this side already so a deep
    recursion does not ship megabytes (the owner cuts again: it trusts no worker)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return protocol.clip_traceback(text) or ""


def _moving_average(avg: float | None, sample: float) -> float:
    """An exponential moving average that weighs the newest sample 0.2 (the first: 1)."""
    return sample if avg is None else avg + 0.2 * (sample - avg)
