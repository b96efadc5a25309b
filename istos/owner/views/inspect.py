"""Read-only inspection of an owner, plus admin actions that exist only with ``admin=True``.

Installed on every owner as extra request ops (see docs/protocol.md):
``stats``, ``jobs`` (paged, by state, by payload field), ``leases``, ``why`` (why a job is not
running), ``events`` (recent events from the owner's ring) and ``follow`` (ask the owner to
publish its live event stream for a while). Admin ops: ``requeue`` (resubmit: a dead job's
body enqueued again under a new id), ``purge_dead``, ``pause``, ``resume`` — refused with
``AdminDisabled`` unless the queue was declared with ``admin=True``.

Nothing here runs unless asked: the live stream is published only while a follower has renewed
its interest within ``FOLLOW_TTL_S``, so an owner nobody inspects pays nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import islice
from typing import Any

from ... import codec, keys, protocol
from ... import events as ev
from ...clock import Clock
from ...codec import Packed, Spliced
from ...core.config import QueueConfig
from ...core.edit import lifecycle_fields
from ...core.ready_order import ReadyOrder
from ...core.state import (
    CANCELLED,
    DEAD,
    DELAYED,
    EXPIRED,
    LEASED,
    READY,
    JobRecord,
    QueueState,
)
from ...events import JobEvent
from ...payload import is_encoded
from ..extension import Handler, OwnerExtension
from ..handle import OwnerHandle
from ..handlers.fit import fit_why
from ..handlers.job_ops import dead_letter_fields
from ..persistence.sequence import EventSequence
from .slicing import CHECK_EVERY, Slicer, packed_page, pause

FOLLOW_TTL_S = protocol.MAX_FOLLOW_TTL_S
MAX_PAGE = protocol.MAX_PAGE
MAX_EVENTS_PER_REPLY = protocol.MAX_EVENTS  # and never more bytes than a page holds
SCAN_SLICE = 256  # a payload search yields to the loop at least this often...
RESUBMITTED_MEMORY = 10_000  # resubmit ids remembered after their job was forgotten
SCAN_SLICE_S = 0.004  # ...and after this long, so claims and stats keep flowing
AHEAD_CHUNK = 1024  # records `why` compares between two looks at the clock


class Inspector(OwnerExtension):
    """Counters, rates and the follower-gated event stream of one owner."""

    name = "inspect"
    serves = ("stats", "jobs", "leases", "why", "events", "follow", "requeue", "purge_dead",
              "pause", "resume", "events_since")

    def __init__(self, owner: OwnerHandle) -> None:
        self.owner = owner
        self.totals = {ev.ENQUEUED: 0, ev.ACKED: 0, ev.NACKED: 0, ev.DEAD_LETTERED: 0,
                       ev.LEASE_EXPIRED: 0, ev.EXPIRED: 0}
        self._buckets: deque[list[float]] = deque(maxlen=61)  # [second, enqueued, acked]
        self._follow_until = 0.0
        self._outbox: list[dict[str, Any]] = []
        self._flush_scheduled = False
        self._batch_seq = 0
        self._resubmitted: dict[str, None] = {}  # ids made by resubmit, oldest first (bounded)
        self._seqs: list[int] = []  # the sequence numbers of the events in _outbox
        self._packed_events: dict[int, bytes] = {}  # the last events page, by number in the log
        # A new epoch per owner life (and the HA leader's epoch in it, when there is one); from
        # the node and its start time, not the id source, so simulations replay unchanged.
        life = f"{owner.node.node_id}\0{owner.name}\0{owner.node.clock.now()!r}".encode()
        fresh = hashlib.blake2b(life, digest_size=6).hexdigest()
        fence = owner.fence
        self.sequence = EventSequence(fresh if fence is None else f"{fence.epoch}-{fresh}")
        self._unsubscribe = owner.node.events.subscribe(self._on_event)

    def on_stop(self) -> None:
        self._unsubscribe()

    def ops(self) -> Mapping[str, Handler]:
        return {"stats": self.op_stats, "jobs": self.op_jobs, "leases": self.op_leases,
                "why": self.op_why, "events": self.op_events, "follow": self.op_follow,
                "requeue": self.op_resubmit, "purge_dead": self.op_purge,
                "pause": self.op_pause, "resume": self.op_resume,
                "events_since": self.op_events_since}

    # -- counting and streaming --
    def _on_event(self, event: JobEvent) -> None:
        if event.queue != self.owner.name:
            return
        kind = event.kind
        if kind in self.totals:
            self.totals[kind] += 1
            if kind in (ev.ENQUEUED, ev.ACKED):
                second = float(int(event.t))
                if not self._buckets or self._buckets[-1][0] != second:
                    self._buckets.append([second, 0.0, 0.0])
                self._buckets[-1][1 if kind == ev.ENQUEUED else 2] += 1
        n = self.sequence.number(event)
        if self._follow_until and event.t <= self._follow_until:
            self._outbox.append(event.to_dict())
            self._seqs.append(n)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        batch, self._outbox, self._flush_scheduled = self._outbox, [], False
        seqs, self._seqs = self._seqs, []
        transport = self.owner.node.transport
        if batch and transport is not None and self.owner.running:
            # A sequence number per batch lets followers count batches the mesh dropped.
            self._batch_seq += 1
            payload = codec.encode_message({"v": codec.PROTOCOL_VERSION, "seq": self._batch_seq,
                                            "events": batch, "epoch": self.sequence.epoch,
                                            "seqs": seqs})
            asyncio.get_running_loop().create_task(
                transport.put(keys.events_key(self.owner.node.prefix, self.owner.name), payload))

    def rates(self, now: float, window_s: float = 10.0) -> tuple[float, float]:
        """Enqueues and acks per second over the last ``window_s`` whole seconds."""
        start = now - window_s
        enq = sum(b[1] for b in self._buckets if b[0] >= start)
        ack = sum(b[2] for b in self._buckets if b[0] >= start)
        return enq / window_s, ack / window_s

    # -- read-only ops --
    async def op_stats(self, msg: dict[str, Any]) -> dict[str, Any]:
        out = self.owner.stats()
        enq_rate, ack_rate = self.rates(self.owner.node.clock.now())
        config = self.owner.config
        out.update(enqueue_rate=enq_rate, ack_rate=ack_rate, totals=dict(self.totals),
                   admin=config.admin, lease_s=config.policy.lease_s,
                   max_attempts=config.policy.max_attempts, policy=queue_policy(config))
        limiter = self.owner.state.limiter
        if limiter is not None:  # tokens now, and slots refused while jobs waited
            out["rate_limit"] = limiter.describe(self.owner.node.clock.now())
        groups = self.owner.state.heaps.groups
        if groups is not None:  # once the queue saw a grouped job: the busiest groups
            out["groups"] = groups.summary(self.owner.node.clock.now())
        return {"stats": out}

    async def op_jobs(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A page of jobs (by state, by payload fields), bounded by count and bytes."""
        offset = msg.get("offset", 0)
        limit = min(MAX_PAGE, msg.get("limit", 100))
        encoded = [0]  # bodies encoded by payload codecs, which a `where` cannot look into
        test = job_filter(msg, encoded)
        which = msg.get("state")
        if which is not None:  # the cheap test first
            rest = test
            test = (lambda r: r.state == which) if rest is None \
                else (lambda r: r.state == which and rest(r))
        matched = await self._matching(test, offset, limit + 1)
        jobs, more = protocol.page(matched, job_summary, limit)
        reply = {"jobs": jobs, "offset": offset, "limit": limit, "more": more,
                 "next_offset": offset + len(jobs)}
        if encoded[0]:
            reply["unsearched"] = encoded[0]
        return reply

    async def _matching(self, test: Callable[[JobRecord], bool] | None, offset: int,
                        want: int) -> list[JobRecord]:
        """Up to ``want`` records passing ``test`` after skipping ``offset`` of them.

        A snapshot of the job ids, walked in slices: a search over a deep queue (a payload
        decode, or just 100k records to skip) must not stall the owner's claims and acks."""
        if test is None:  # no walk in Python: the C iterator skips to the offset
            return list(islice(self.owner.state.jobs.values(), offset, offset + want))
        await pause()  # the copy below in a step of its own (see slicing.Slicer)
        clock = self.owner.node.clock
        slice_end = clock.monotonic() + SCAN_SLICE_S  # (the copy spends the first slice)
        # A snapshot of the ids, not the records: a list of 100k records kept across yields
        # makes every young collection touch each record's GC header (milliseconds each).
        jobs = self.owner.state.jobs
        ids = list(jobs)
        matched: list[JobRecord] = []
        skipped, start = 0, 0
        while start < len(ids) and len(matched) < want:
            for job_id in ids[start:start + SCAN_SLICE]:
                if (start & 7) == 7 and clock.monotonic() >= slice_end:
                    break  # this slice took its time: let others in (a big body is slow)
                start += 1  # (after the look: the record a slice ends at is the next's first)
                rec = jobs.get(job_id)
                if rec is None or not test(rec):  # (gone since the snapshot: skipped)
                    continue
                if skipped < offset:
                    skipped += 1
                    continue
                matched.append(rec)
                if len(matched) >= want:
                    break
            if start < len(ids):
                await pause()
                slice_end = clock.monotonic() + SCAN_SLICE_S
        return matched

    async def op_leases(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Live leases (never their tokens), paged by count and bytes."""
        offset = msg.get("offset", 0)
        limit = min(MAX_PAGE, msg.get("limit", MAX_PAGE))
        leased = await self._matching(lambda r: r.state == LEASED, offset, limit + 1)
        leases, more = protocol.page(leased, lease_summary, limit)
        return {"leases": leases, "more": more, "next_offset": offset + len(leases)}

    async def op_why(self, msg: dict[str, Any]) -> dict[str, Any]:
        rec = self.owner.state.jobs.get(msg["job_id"])
        ahead = None
        if rec is not None and rec.state == READY:
            order = await self._ready_order()
            if order is not None:
                ahead = order.ahead_of(rec.job_id)  # O(log n)
            elif rec.state == READY:  # another `why` is making the index: count, in slices
                ahead = 0
                await pause()  # the copy below in a step of its own (see slicing.Slicer)
                slicer = Slicer(self.owner.node.clock)  # (the copy spends the first slice)
                records = list(self.owner.state.jobs.values())
                for start in range(0, len(records), AHEAD_CHUNK):
                    ahead += count_ahead(records[start:start + AHEAD_CHUNK], rec)
                    await slicer.tick(CHECK_EVERY)
        return {"why": explain(self.owner, msg["job_id"], ahead)}

    async def _ready_order(self) -> ReadyOrder | None:
        """The queue's index of ready jobs, made (and seeded, in slices) at the first call;
        None while another call is seeding it."""
        state = self.owner.state
        order = state.heaps.order
        if order is not None:
            return order if order.complete else None
        order = state.heaps.order = ReadyOrder()  # records every change from now on
        await pause()  # the copy below in a step of its own (see slicing.Slicer)
        slicer = Slicer(self.owner.node.clock)
        entries = state.heaps.ready_entries()
        for start in range(0, len(entries), AHEAD_CHUNK):
            order.seed(entries[start:start + AHEAD_CHUNK], state.jobs)
            await slicer.tick(CHECK_EVERY)
        if state.heaps.order is not order:  # (the state's heaps were replaced meanwhile)
            return None
        order.complete = True
        return order

    async def op_events(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The newest events of this queue (at most ``limit`` and one page of bytes), oldest
        first; ``more`` says older ones were left out."""
        limit = min(MAX_EVENTS_PER_REPLY, msg.get("limit", 1000))
        name = self.owner.name
        ring = self.owner.node.events.snapshot_newest_first()  # (merged as the walk goes)
        mine = (entry for entry in ring if entry[1].queue == name)
        events, more, self._packed_events = await page_sliced_events(
            mine, limit, self.owner.node.clock, self._packed_events)
        events.reverse()
        return Spliced(events=Packed(events), more=more)

    async def op_follow(self, msg: dict[str, Any]) -> dict[str, Any]:
        ttl = min(FOLLOW_TTL_S, max(1.0, float(msg.get("ttl_s", FOLLOW_TTL_S))))
        # The latest deadline wins: one follower's short ttl must not cut another's stream.
        self._follow_until = max(self._follow_until, self.owner.node.clock.now() + ttl)
        return {"key": keys.events_key(self.owner.node.prefix, self.owner.name), "ttl_s": ttl}

    async def op_events_since(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Events after a follower's last ``(epoch, after)``: see
        :mod:`istos.owner.persistence.sequence`."""
        limit = min(MAX_EVENTS_PER_REPLY, msg.get("limit", MAX_EVENTS_PER_REPLY))
        return await self.sequence.since(msg.get("epoch"), msg.get("after", 0), limit,
                                         self.owner.node.clock)

    # -- admin ops --
    async def op_resubmit(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The ``requeue`` op (``resubmit``): enqueue a dead job's body again under a new id,
        once: the new id is derived from the dead letter (its id and when it died), so a second
        resubmit of the same dead letter -- a retry, a
        double click, another operator -- finds that job and answers ``already_requeued``
        with its id instead of making a second one. While the new job is held that survives
        restarts; after it finished and was forgotten, this owner still remembers it."""
        self.owner.require_admin("requeue")
        rec = self.owner.state.dead.get(msg["job_id"])
        if rec is None:
            return {"job_id": None}
        new_id = resubmit_id(rec)
        if new_id in self._resubmitted or self.owner.state.holds(new_id):
            return {"job_id": new_id, "status": "already_requeued"}
        created = await self.owner.enqueue(rec.body, job_id=new_id, priority=rec.priority)
        self._resubmitted[new_id] = None
        while len(self._resubmitted) > RESUBMITTED_MEMORY:
            self._resubmitted.pop(next(iter(self._resubmitted)))
        return {"job_id": new_id, "status": "requeued" if created else "already_requeued"}

    async def op_purge(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.owner.require_admin("purge_dead")
        ids = msg.get("job_ids")
        purged = self.owner.state.purge_dead(self.owner.node.clock.now(), ids)
        await self.owner.writes.commit()
        return {"purged": purged}

    async def op_pause(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.owner.require_admin("pause")
        group = msg.get("group")
        pause = await self.owner.pauses.pause(by=msg.get("by"), reason=msg.get("reason"),
                                              group=group)
        return {"paused": True, "pause": pause.to_dict(), "group": group}

    async def op_resume(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.owner.require_admin("resume")
        group = msg.get("group")
        was = await self.owner.pauses.resume(group=group)
        return {"paused": self.owner.pauses.get(group) is not None,
                "was": None if was is None else was.to_dict(), "group": group}


async def page_sliced_events(entries: Iterator[tuple[int, JobEvent]], limit: int, clock: Clock,
                             cache: dict[int, bytes]) -> tuple[list[bytes], bool, dict[int, bytes]]:
    """A page of numbered events from the log, newest first, packed (see :func:`packed_page`)."""
    return await packed_page(entries, _log_number, _log_event, limit, clock, cache)


def _log_number(entry: tuple[int, JobEvent]) -> int:
    return entry[0]


def _log_event(entry: tuple[int, JobEvent]) -> dict[str, Any]:
    return entry[1].to_dict()


def queue_policy(config: QueueConfig) -> dict[str, Any]:
    """The queue's declared policy, named as ``app.queue(...)`` takes it."""
    policy = config.policy
    out: dict[str, Any] = {
        "lease_s": policy.lease_s, "max_attempts": policy.max_attempts,
        "retry_backoff_s": policy.backoff.base_s, "retry_backoff_max_s": policy.backoff.max_s,
        "retry_jitter": policy.backoff.jitter, "keep_results": policy.keep_results,
        "result_ttl_s": policy.result_ttl_s, "admin": config.admin}
    if policy.rate_limit is not None:  # (only when declared: the common shape stays)
        out["rate_limit"] = list(policy.rate_limit)
    return out


def resubmit_id(rec: JobRecord) -> str:
    """The id a resubmit of dead letter ``rec`` gets: a function of the dead letter alone
    (the same shape as the node's ids, 24 hex characters), so resubmitting it twice is one job.
    (The seed's ``requeue`` is the op's wire name: ids stay what they were.)"""
    seed = f"requeue\0{rec.job_id}\0{rec.finished_at!r}\0{rec.attempts}".encode()
    return hashlib.blake2b(seed, digest_size=12).hexdigest()


def lease_summary(rec: JobRecord) -> dict[str, Any]:
    return {"job_id": rec.job_id, "worker": rec.lease_worker, "deadline": rec.lease_deadline,
            "attempt": rec.attempts}


def job_summary(rec: JobRecord) -> dict[str, Any]:
    return {"job_id": rec.job_id, "state": rec.state, "priority": rec.priority,
            "attempts": rec.attempts, "enqueued_at": rec.enqueued_at, "ready_at": rec.ready_at,
            "worker": rec.lease_worker if rec.state == LEASED else None,
            "deadline": rec.lease_deadline if rec.state == LEASED else None,
            "last_error": rec.last_error, "body": rec.body,
            "progress": rec.progress, "progress_note": rec.progress_note,
            **({"group": rec.group} if rec.group is not None else {}),
            **({"start_by": rec.start_by} if rec.start_by is not None else {}),
            **({"unique_key": rec.unique_key, "unique": rec.unique}
               if rec.unique_key is not None else {}),
            **({"debounce_key": rec.debounce_key} if rec.debounce_key is not None else {})}


def explain(owner: OwnerHandle, job_id: str, ahead: int | None = None) -> dict[str, Any]:
    """Why a job is (not) running, in words and fields (``ahead``: the ready jobs claimed
    before it, if counted already)."""
    rec = owner.state.jobs.get(job_id)
    now = owner.node.clock.now()
    if rec is None:
        return {"state": "unknown", "reason": "the queue does not hold this job (never "
                "enqueued, acked without keep_results, expired or purged)"}
    job = {**job_summary(rec), "finished_at": rec.finished_at, "expires_at": rec.expires_at,
           "history": [a.to_dict() for a in rec.history]}
    if rec.state == DEAD:  # body and history travel once, in dead_letter: one body per reply
        del job["body"], job["history"]
    out: dict[str, Any] = {"state": rec.state, "attempts": rec.attempts,
                           "last_error": rec.last_error, "progress": rec.progress,
                           "progress_note": rec.progress_note,
                           "now": now, "job": job}
    out.update(lifecycle_fields(rec))  # its unique key, burst and edits (core/edit.py)
    if rec.state == LEASED:
        out.update(worker=rec.lease_worker, until=rec.lease_deadline,
                   reason=f"leased by {rec.lease_worker} until its lease ends in "
                          f"{(rec.lease_deadline or now) - now:.1f} s"
                          + (" (cancel requested)" if rec.cancel_requested else ""))
    elif rec.state == DELAYED:
        wait = rec.ready_at - now
        if rec.attempts and rec.last_error:
            out["reason"] = (f"backing off after attempt {rec.attempts} failed with "
                             f"{rec.last_error!r}; eligible again in {wait:.1f} s")
        else:
            out["reason"] = f"delayed by the producer; eligible in {wait:.1f} s"
        out["until"] = rec.ready_at
    elif rec.state == READY:
        ahead = ready_ahead_of(owner.state, rec) if ahead is None else ahead
        out["ahead"] = ahead
        paused = " (claiming is paused)" if owner.state.paused else \
            " (its group is paused)" if rec.group in owner.state.heaps.paused_groups else ""
        out["reason"] = f"ready, waiting behind {ahead} ready job(s){paused}"
    elif rec.state == DEAD:
        out["reason"] = f"dead-lettered after {rec.attempts} attempts: {rec.last_error}"
        out["dead_letter"] = dead_letter_fields(rec)
    elif rec.state == CANCELLED:
        out["reason"] = "cancelled; kept until " + str(rec.expires_at)
    elif rec.state == EXPIRED:
        out["reason"] = (f"expired, never run: no worker started it by its start deadline "
                         f"{rec.start_by}; kept until {rec.expires_at}")
    else:
        left = "" if rec.expires_at is None else f" for {rec.expires_at - now:.1f} s more"
        out["reason"] = f"done; result kept{left}"
        out["until"] = rec.expires_at
        out.update(shown_result(rec.result))
    # Logs beyond the frame are left out here and counted; the ``logs`` op reads them all.
    return fit_why(out)


def shown_result(result: bytes | None) -> dict[str, Any]:
    """A kept result as ``why`` shows it: the encoded bytes up to ``MAX_RESULT_SHOWN``, else
    only its size (``result_size`` always; ``result`` None when it was too big or absent)."""
    if result is None:
        return {"result": None, "result_size": 0}
    size = len(result)
    return {"result": result if size <= protocol.MAX_RESULT_SHOWN else None,
            "result_size": size}


def job_filter(msg: dict[str, Any], encoded: list[int] | None = None
               ) -> Callable[[JobRecord], bool] | None:
    """The search a ``jobs`` request asks for (None: every job of the state): the last error
    contains ``error``; some attempt's worker contains ``worker``; ``enqueued_at`` and
    ``finished_at`` within ``*_after`` / ``*_before`` (inclusive; a job not finished never
    matches a ``finished_*`` bound); the decoded body has every ``where`` path. The cheap
    tests run first, the payload decode last. A body encoded by payload codecs never matches
    a ``where``; ``encoded[0]`` counts those the search met."""
    tests: list[Callable[[JobRecord], bool]] = []
    error, worker = msg.get("error"), msg.get("worker")
    if error is not None:
        tests.append(lambda r: error in (r.last_error or ""))
    if worker is not None:
        tests.append(lambda r: any(worker in a.worker for a in r.history))
    for name in ("enqueued", "finished"):
        lo, hi = msg.get(f"{name}_after"), msg.get(f"{name}_before")
        if lo is not None or hi is not None:
            tests.append(_in_range(f"{name}_at", lo, hi))
    paths = [(str(path).split("."), value) for path, value in (msg.get("where") or {}).items()]
    if paths:
        tests.append(lambda r: _payload_matches(r.body, paths, encoded))
    if not tests:
        return None
    return lambda rec: all(t(rec) for t in tests)


def _in_range(attr: str, lo: float | None, hi: float | None) -> Callable[[JobRecord], bool]:
    def test(rec: JobRecord) -> bool:
        t = getattr(rec, attr)
        return t is not None and (lo is None or t >= lo) and (hi is None or t <= hi)
    return test


def _payload_matches(body: bytes, where: list[tuple[list[str], Any]],
                     encoded: list[int] | None = None) -> bool:
    """Whether the decoded body has every (already split) path equal to its value (never,
    for a body encoded by payload codecs: counted in ``encoded[0]``)."""
    if is_encoded(body):
        if encoded is not None:
            encoded[0] += 1
        return False
    try:
        data = codec.decode_body(body)
    except Exception:
        return False
    for parts, expected in where:
        value: Any = data
        for part in parts:
            if not isinstance(value, dict) or part not in value:
                return False
            value = value[part]
        if value != expected:
            return False
    return True


def iter_state(state: QueueState, which: str | None = None) -> Iterator[JobRecord]:
    """The records of ``state`` in one state (every record when None), in insertion order."""
    for rec in state.jobs.values():
        if which is None or rec.state == which:
            yield rec


def ready_ahead_of(state: QueueState, rec: JobRecord) -> int:
    """How many ready jobs would be claimed before ``rec``: from the queue's index of the
    ready jobs (O(log n)), or counted (O(n)) if it does not hold ``rec``."""
    order = state.heaps.order
    ahead = order.ahead_of(rec.job_id) if order is not None and order.complete else None
    return count_ahead(state.jobs.values(), rec) if ahead is None else ahead


def count_ahead(records: Iterable[JobRecord], rec: JobRecord) -> int:
    """How many of ``records`` are ready and ordered before ``rec`` in the ready queue: by
    ``(-priority, ready_at, seq)``, compared field by field (a tuple per record cost twice
    as much; ``seq`` is unique, so ``rec`` itself never counts)."""
    p, at, seq = rec.priority, rec.ready_at, rec.seq
    return sum(1 for r in records if r.state == READY and (
        r.priority > p or r.priority == p and (r.ready_at < at or r.ready_at == at
                                               and r.seq < seq)))
