"""The worker's side of leases that follow a live worker: heartbeats, run timeouts, cancellation.

One :class:`HeldLeases` per worker tracks every job it holds (running and prefetched) with the
time its lease ends *as this worker can be sure of it*: the send time of the request that granted
or renewed it, plus ``lease_s`` (the owner counted from a later instant, so this never runs past
the owner's deadline). That makes one rule cheap for every worker, heart-beating or not: a job
whose lease already ended is never started (a prefetched job waiting behind a slow one).

With ``heartbeat=True`` a single loop renews all of them in one ``extend`` request every
``lease_s / 3`` (up to 1024 items per request), whatever the number of jobs held: like Temporal's
activity heartbeats or SQS's batched ChangeMessageVisibility, and unlike a timer per job. A
worker that dies or is cut off stops renewing, so its jobs come back about ``lease_s`` later.

Cancellation (the owner answers ``cancel`` to a renewal, names the job in a claim reply, or sends
a targeted message) and ``timeout_s`` both end a run the same way: the running task is cancelled
(an async function sees ``CancelledError``; a thread function cannot be interrupted and is told
through ``ctx.cancelled``) and the attempt is nacked with ``JobCancelled`` or ``JobTimeout``.
The owner turns a cancelled job's nack into the final state ``cancelled``; a timeout is retried
with backoff like any failure. Renewals stop at ``timeout_s``: they never extend a run past it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from .. import codec
from ..client import OwnerClient
from ..context import RunSignals
from ..core.config import WorkerConfig
from ..core.leasing import MAX_EXTEND_ITEMS
from ..errors import IstosError, JobCancelled, JobTimeout
from ..node import Node
from ..wakeup import Wakeup


class LeaseHolder(Protocol):
    """What the leases need of their worker (:class:`~istos.worker.worker.WorkerRunner`,
    which builds them: an interface, so the two modules do not import each other)."""

    node: Node
    config: WorkerConfig
    client: OwnerClient
    slot_ids: list[str]

    @property
    def stopping(self) -> bool: ...
    @property
    def lease_s(self) -> float | None: ...


class Claimed(Protocol):
    @property
    def job_id(self) -> str: ...
    @property
    def token(self) -> str: ...

log = logging.getLogger("istos.worker")


@dataclass(slots=True)
class Held:
    """One lease this worker holds, from its claim until its run ends."""

    job_id: str
    token: str
    expires: float  # worker monotonic time by which the lease surely ended (unless renewed)
    # Made on first use (a ``ctx`` parameter, a timeout, a cancel): most runs never need one.
    signals: RunSignals | None = None
    started: float | None = None  # monotonic start of the run (None while prefetched)
    task: asyncio.Task[Any] | None = None  # set while the function runs
    runner_task: asyncio.Task[Any] | None = None  # the worker's task for this job
    cancel_requested: bool = False
    timed_out: bool = False
    lost: bool = False  # the owner answered stale: renewing is pointless


class HeldLeases:
    def __init__(self, runner: LeaseHolder) -> None:
        self.runner = runner
        # By lease token, not job id: a job whose lease ended while it waited here may be
        # claimed again by this same worker before the stale copy is dropped.
        self.held: dict[str, Held] = {}
        self.heartbeats = 0  # extend requests sent
        self._have_jobs = Wakeup()
        self._loop: asyncio.Task[None] | None = None
        self._sub: Any = None
        self._closed = False

    # -- lifecycle --
    async def start(self) -> None:
        runner = self.runner
        transport = runner.node.transport
        if transport is not None:
            self._sub = await transport.declare_subscriber(
                runner.node.key(runner.config.queue, "cancel"), self._on_cancel_message)
        if runner.config.heartbeat:
            self._loop = asyncio.get_running_loop().create_task(self._beat_loop())

    async def stop(self) -> None:
        """After the runs ended (shutdown keeps renewing through the grace period)."""
        self.kill()
        if self._loop is not None:
            await asyncio.gather(self._loop, return_exceptions=True)

    def kill(self) -> None:
        self._closed = True
        if self._sub is not None:
            self._sub.close()
            self._sub = None
        if self._loop is not None:
            self._loop.cancel()

    # -- holding (the per-job hot path: a claim, a run, an ack; kept to a few attribute reads) --
    def hold(self, job: Claimed, sent_at: float, lease_s: float | None) -> Held:
        held = Held(job.job_id, job.token, sent_at + (lease_s or 0.0))
        self.held[job.token] = held
        if self._loop is not None:
            self._have_jobs.set()
        return held

    def finish(self, held: Held, outcome: dict[str, Any] | None) -> None:
        """The run ended (or never started): stop tracking it, and add progress reported
        since the last heartbeat to its ack or nack."""
        self.held.pop(held.token, None)
        sig = held.signals
        if outcome is not None and sig is not None and sig.dirty:
            sig.dirty = False
            outcome["progress"], outcome["note"] = sig.fraction, sig.note
        if outcome is not None and sig is not None and (
                sig.logs or sig.logs_dropped != sig.dropped_confirmed):
            outcome["logs_at"], outcome["logs"], outcome["logs_dropped"] = sig.pending_logs()

    def signals_of(self, held: Held) -> RunSignals:
        if held.signals is None:
            held.signals = RunSignals()
        return held.signals

    def verdict(self, held: Held, now: float) -> str:
        """Before starting: ``run``; ``expired`` (the lease ended while the job waited, or the
        owner answered a renewal ``stale``: drop it silently, the owner takes it back); or
        ``cancelled`` (nack it with JobCancelled)."""
        if held.cancel_requested:
            return "cancelled"
        if held.lost or now >= held.expires:
            return "expired"  # (the runner logs it, with the job's fields)
        return "run"

    # -- one run, bounded by timeout_s and open to cancellation --
    async def guard(self, held: Held, run: Coroutine[Any, Any, Any], started: float) -> Any:
        """Await ``run``; raise JobTimeout past ``timeout_s``, JobCancelled on request."""
        timeout = self.runner.config.timeout_s
        task = held.runner_task or asyncio.current_task()
        held.task, held.started = task, started
        timer = None
        if timeout is not None:
            timer = asyncio.get_running_loop().call_later(
                self.runner.node.clock.to_loop_seconds(timeout), self._time_out, held)
        try:
            if held.cancel_requested:
                run.close()
                raise asyncio.CancelledError
            result = await run
            if held.timed_out:  # the function swallowed the cancellation: still a timeout
                raise asyncio.CancelledError
            return result
        except asyncio.CancelledError:
            if self.runner.stopping or not (held.timed_out or held.cancel_requested):
                raise  # shutdown or crash: no nack, the lease brings the job back
            uncancel = getattr(task, "uncancel", None)  # Python >= 3.11 counts cancels
            if uncancel is not None:
                uncancel()
            if held.cancel_requested:
                raise JobCancelled(f"job {held.job_id!r} was cancelled while running") from None
            raise JobTimeout(f"job {held.job_id!r} of queue {self.runner.config.queue!r} ran "
                             f"longer than timeout_s={timeout:g}") from None
        finally:
            held.task = None
            if timer is not None:
                timer.cancel()

    def _time_out(self, held: Held) -> None:
        if held.task is not None:
            held.timed_out = True
            self.signals_of(held).cancelled = True
            held.task.cancel()

    def cancel(self, job_ids: list[str]) -> None:
        """The owner says these jobs are cancelled: stop the ones running here."""
        wanted = {str(j) for j in job_ids}
        for held in self.held.values():
            if held.job_id not in wanted or held.cancel_requested:
                continue
            held.cancel_requested = True
            self.signals_of(held).cancelled = True
            if held.task is not None:
                held.task.cancel()

    def _on_cancel_message(self, key: str, payload: bytes) -> None:
        try:
            msg = codec.decode_message(payload)
        except IstosError:
            return
        if self.runner.node.node_id in (msg.get("to") or ()):
            jobs = msg.get("jobs")
            if isinstance(jobs, list):
                self.cancel([j for j in jobs if isinstance(j, str)])

    # -- heartbeats --
    async def _beat_loop(self) -> None:
        clock = self.runner.node.clock
        last: float | None = None  # when the previous beat was due
        while not self._closed:
            lease_s = self.runner.lease_s
            if not self.held or lease_s is None:
                self._have_jobs.clear()
                await self._have_jobs.wait(None)
                last = None
                continue
            # A fixed cadence (not "sleep, then beat"): the round trip of one beat does not
            # delay the next, so a lease is renewed at most lease_s / 3 after the last renewal.
            now = clock.monotonic()
            due = now + lease_s / 3 if last is None else max(last + lease_s / 3, now - lease_s)
            await clock.sleep(due - now)
            last = due
            await self.beat(lease_s)

    async def beat(self, lease_s: float) -> None:
        """Renew every held lease: one extend request per 1024 jobs (normally one)."""
        clock, timeout = self.runner.node.clock, self.runner.config.timeout_s
        now = clock.monotonic()
        items: list[dict[str, Any]] = []
        for held in self.held.values():
            if held.lost or held.cancel_requested:
                continue
            if timeout is not None and held.started is not None and now - held.started >= timeout:
                continue  # never extend a run past its timeout
            item: dict[str, Any] = {"job_id": held.job_id, "token": held.token}
            sig = held.signals
            if sig is not None and sig.dirty:
                sig.dirty = False
                item["progress"], item["note"] = sig.fraction, sig.note
            if sig is not None and sig.logs_pending():
                item["logs_at"], item["logs"], item["logs_dropped"] = sig.pending_logs()
            items.append(item)
        for start in range(0, len(items), MAX_EXTEND_ITEMS):
            await self._send(items[start:start + MAX_EXTEND_ITEMS], lease_s)

    async def _send(self, items: list[dict[str, Any]], lease_s: float) -> None:
        clock = self.runner.node.clock
        sent = clock.monotonic()
        self.heartbeats += 1
        try:
            reply = await self.runner.client.call("extend", timeout_s=lease_s / 3, items=items)
        except IstosError as exc:
            log.warning("worker %s: renewing %d lease(s) failed: %s", self.runner.slot_ids[0],
                        len(items), exc)
            for item in items:  # the progress did not get through: send it next time
                held = self.held.get(item["token"])
                if held is not None and "progress" in item and held.signals is not None:
                    held.signals.dirty = True
            return  # (unconfirmed log lines stay: the next beat or the ack sends them again)
        cancelled = []
        for item, status in zip(items, reply.get("statuses") or []):
            held = self.held.get(item["token"])
            if held is None:
                continue
            if "logs" in item and status in ("ok", "cancel") and held.signals is not None:
                held.signals.confirm_logs(item["logs_at"] + len(item["logs"]),
                                          item["logs_dropped"])
            if status == "ok":
                held.expires = sent + lease_s
            elif status == "cancel":
                cancelled.append(item["job_id"])
            else:
                held.lost = True
        self.cancel(cancelled)
