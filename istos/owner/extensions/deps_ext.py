"""Dependencies on a queue owner: the child side (waiting jobs) and the parent side (watches).

Every owner of an app plays both parts (``core/deps.py`` has the rules, ``client/deps.py`` the
producer's half). It is the batches' reporting machinery (``batches_ext.py``) turned around:
there each member's owner reports the member's end to the batch's home; here each parent's
owner reports the parent's end to each child's owner, at least once, idempotent by parent,
proven by the child's key, retried with the same backoff.

**Child.** An enqueue whose meta holds a ``deps`` entry is stored as any job is (write, then
apply), in state ``waiting`` unless its parents already decided. Its parents' outcomes live in
its record's meta, so a report moves meta and state in ONE record write through the write path
(fenced for an HA leader): a restart or failover reloads exactly what was counted, and a
repeated report finds the outcome already there. Once stored, and again for every waiting
child when the owner starts, the owner asks each parent still pending for its state
(``dep_watch``, idempotent): an end that no report brought (the parent ended before the child
was stored, or while this owner was down) is found that way.

**Parent.** ``dep_watch`` stores one watch per (parent, child) in namespace
``deps:{queue}`` (storage first, then memory) and answers the parent's state. When a watched
parent ends (its ``acked``, ``dead_lettered``, ``cancelled`` or ``expired`` event, published
once the change is stored), each watch's child is sent ``dep_report`` until its owner
answers; a restarted owner reloads its watches and reports every parent that ended, or that
it no longer holds (a done job forgotten at its ack: it counts as ``done``). A watch is deleted
once ``done`` or ``cancelled`` was answered; after ``dead`` it stays until the parent is
purged, so a dead parent requeued and then done still reaches its children.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

import msgpack

from ... import events as ev
from ... import protocol
from ...core import deps
from ...core.records import WAITING, JobRecord
from ...errors import CapacityExceeded, InvalidJob, IstosError, JobNotFound
from ...events import JobEvent
from ..extension import Handler, OwnerExtension, not_wrapped
from ..handlers.fit import fit_why
from .reports import RETRY_MAX_S, RETRY_MIN_S, ReportQueue  # (watches back off as reports do)

if TYPE_CHECKING:
    from ..handle import OwnerHandle

log = logging.getLogger("istos.deps")

ENDS = {ev.ACKED: deps.DONE, ev.DEAD_LETTERED: deps.DEAD, ev.CANCELLED: deps.CANCELLED,
        ev.EXPIRED: deps.CANCELLED}
"""A watched parent's events that end it, and the outcome each reports."""
ROUTED = frozenset({ev.OWNER_UP, ev.PURGED, *ENDS})
FINAL = (deps.DONE, deps.CANCELLED)  # outcomes after which a watch is deleted
NOT_SUPPORTED = ("unique", "debounce", "expires_s", "start_by")

Call = Callable[..., Awaitable[dict[str, Any]]]  # (queue, op, **fields) -> reply


class Watch:
    """One child's watch of one parent, as the parent's owner holds it."""

    __slots__ = ("child_id", "child_queue", "key", "parent", "wkey")

    def __init__(self, parent: str, child_queue: str, child_id: str, key: str) -> None:
        self.parent, self.child_queue, self.child_id, self.key = \
            parent, child_queue, child_id, key
        self.wkey = deps.watch_key(parent, child_queue, child_id)


class DepsOwner(OwnerExtension):
    """One owner's dependencies extension (see the module doc)."""

    name = "deps"
    serves = ("dep_watch", "dep_report")
    wraps = ("enqueue", "why")
    meta_only_wraps = ("enqueue",)  # a request without deps meta goes straight through

    def __init__(self, owner: OwnerHandle, call: Call,
                 watching: Callable[[], None] | None = None) -> None:
        self.owner = owner
        self._call = call
        # Told whenever a parent gains a watch: the router starts passing job ends along
        # then, so a queue nobody depends on pays nothing per ack (features/deps.py).
        self._watching = watching
        self.ns = f"deps:{owner.name}"
        self.watches: dict[str, dict[str, Watch]] = {}  # parent id -> watch key -> watch
        # A watched parent's end, by watch key: (the watch, the outcome to report).
        self._reports: ReportQueue[str, tuple[Watch, str]] = ReportQueue(
            owner, self._send_report, self._report_deferred)
        self._to_resolve: dict[str, None] = {}  # waiting children to ask their parents about
        self._resolver: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._enqueue: Handler = not_wrapped
        self._why: Handler = not_wrapped

    def ops(self) -> Mapping[str, Handler]:
        return {"dep_watch": self.op_watch, "dep_report": self.op_report}

    def wrap(self, op: str, inner: Handler) -> Handler:
        if op == "enqueue":
            self._enqueue = inner
            return self._op_enqueue
        self._why = inner
        return self._op_why

    # -- the child side ----------------------------------------------------------------------
    async def _op_enqueue(self, msg: dict[str, Any]) -> dict[str, Any]:
        meta = msg.get("meta")
        if not isinstance(meta, dict) or deps.META not in meta:
            return await self._enqueue(msg)
        owner = self.owner
        job_id = msg.get("job_id") or owner.node.ids.new()
        if set(meta) - {deps.META, "trace"}:
            raise InvalidJob(f"job {job_id!r}: deps meta comes alone (or with a trace)")
        if job_id.startswith(protocol.RESERVED_ID_PREFIXES):  # workflows' and schedules' own
            raise InvalidJob(f"job {job_id[:60]!r}: a job waiting for parents cannot take a "
                             "reserved id ('wf:', 'sched:')")
        refused = [f for f in NOT_SUPPORTED if msg.get(f) is not None]
        if refused:
            raise InvalidJob(f"job {job_id!r}: after= does not combine with {refused}")
        entry = deps.check_entry(job_id, meta[deps.META])
        if deps.verdict(entry) == "cancel":
            raise InvalidJob(f"job {job_id!r}: {deps.failure_text(entry)}: nothing enqueued")
        created = await owner.enqueue(
            msg["body"], job_id=job_id, delay_s=float(msg.get("delay_s", 0.0)),
            priority=msg.get("priority", 0), meta=meta, dedup_s=msg.get("dedup_s"),
            group=msg.get("group"))
        rec = owner.state.jobs.get(job_id)
        if created and rec is not None and rec.state == WAITING:
            self._resolve_later(job_id)
        return {"job_id": job_id, "created": created} if created else \
            {"job_id": job_id, "created": False, "reason": "job_id"}

    async def op_report(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``dep_report``: parent ``parent_id`` on ``parent_queue`` ended with ``outcome``;
        counted once per move (idempotent), proven by the child's ``key``. Answers
        ``status``: ``counted``, ``repeat``, ``settled`` (the child waits no more) or
        ``unknown`` (no such child here). Raises :class:`InvalidJob` for a wrong key."""
        rec = self.owner.state.jobs.get(msg["child_id"])
        entry = None if rec is None or not rec.meta else rec.meta.get(deps.META)
        if rec is None or not isinstance(entry, dict):
            return {"status": "unknown"}
        if not hmac.compare_digest(str(entry["key"]).encode(), str(msg["key"]).encode()):
            raise InvalidJob(f"dep_report: wrong key for job {rec.job_id!r}")
        return {"status": await self._count(rec, (msg["parent_queue"], msg["parent_id"]),
                                            msg["outcome"])}

    async def _count(self, rec: JobRecord, parent: tuple[str, str], outcome: str) -> str:
        """Move ``parent``'s outcome in waiting ``rec``'s meta and act on the verdict: one
        record write through the write path (memory is put back if it fails)."""
        if rec.state != WAITING:
            return "settled"
        assert rec.meta is not None
        new = deps.with_outcome(rec.meta[deps.META], parent, outcome)
        if new is None:
            return "repeat"
        state, writes = self.owner.state, self.owner.writes
        generation = writes.generation
        now = self.owner.node.clock.now()
        state.set_meta(rec, {**rec.meta, deps.META: new})
        verdict = deps.verdict(new)
        if verdict == "release":
            state.unblock(rec, now)
        elif verdict == "cancel":
            rec.last_error = deps.failure_text(new)
            state.end_cancelled(rec, now)
        await writes.commit(generation)
        return "counted"

    def _resolve_later(self, child_id: str) -> None:
        self._to_resolve[child_id] = None
        if self._resolver is None or self._resolver.done():
            self._resolver = asyncio.get_running_loop().create_task(self._resolve_all())

    async def _resolve_all(self) -> None:
        """Ask each waiting child's pending parents for their state, until each answered."""
        delay = RETRY_MIN_S
        while self._to_resolve and self.owner.running:
            child_id = next(iter(self._to_resolve))
            try:
                await self._resolve(child_id)
            except IstosError as exc:
                log.info("queue %s: parents of %s not reached yet: %s", self.owner.name,
                         child_id, exc)
                await self.owner.node.clock.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            delay = RETRY_MIN_S
            self._to_resolve.pop(child_id, None)

    async def _resolve(self, child_id: str) -> None:
        rec = self.owner.state.jobs.get(child_id)
        if rec is None or rec.state != WAITING or not rec.meta:
            return
        entry = rec.meta[deps.META]
        for parent in deps.pending_parents(entry):
            reply = await self._call(parent[0], "dep_watch", job_id=parent[1],
                                     child_queue=self.owner.name, child_id=child_id,
                                     key=entry["key"])
            state = reply.get("state")
            # A parent its queue no longer holds, after it was found at enqueue, ended and
            # was forgotten: a done job without kept results (docs/dependencies.md).
            outcome = deps.DONE if state == "unknown" else state
            if outcome in deps.OUTCOMES:
                rec = self.owner.state.jobs.get(child_id)
                if rec is None or rec.state != WAITING:
                    return
                await self._count(rec, parent, str(outcome))

    async def _op_why(self, msg: dict[str, Any]) -> dict[str, Any]:
        reply = await self._why(msg)
        rec = self.owner.state.jobs.get(msg["job_id"])
        entry = None if rec is None or not rec.meta else rec.meta.get(deps.META)
        why = reply.get("why")
        if isinstance(entry, dict) and isinstance(why, dict):
            waits = why["waits_for"] = deps.waits_for(entry)
            if rec is not None and rec.state == WAITING:
                why["reason"] = (
                    "waiting for an operator: a parent failed (on_parent_failure='wait'; "
                    "requeue the parent, promote or cancel this job)"
                    if waits["needs_operator"] else
                    f"waiting for {waits['pending']} of {len(waits['parents'])} parent(s)")
            fit_why(why)
        return reply

    # -- the parent side ---------------------------------------------------------------------
    async def op_watch(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``dep_watch``: watch job ``job_id`` for child ``child_id`` on ``child_queue``
        (proven by ``key`` when it reports); answers the parent's ``state``: ``pending``,
        ``done``, ``dead``, ``cancelled``, or ``unknown`` (this queue holds no such job).
        Idempotent. Raises :class:`CapacityExceeded` past
        :data:`~istos.core.deps.MAX_CHILDREN` watches of one parent."""
        parent = msg["job_id"]
        rec = self.owner.state.jobs.get(parent)
        if rec is None:
            return {"state": "unknown"}
        ended = deps.outcome_of_state(rec.state)
        if ended in FINAL:
            return {"state": ended}
        watch = Watch(parent, msg["child_queue"], msg["child_id"], msg["key"])
        held = self.watches.get(parent, {})
        if watch.wkey not in held:
            if len(held) >= deps.MAX_CHILDREN:
                raise CapacityExceeded(f"dep_watch: job {parent!r} has {len(held)} children "
                                       "waiting for it, the most it may")
            await self.owner.writes.put_aux(self.ns, watch.wkey, msgpack.packb(
                [parent, watch.child_queue, watch.child_id, watch.key]))
            rec = self.owner.state.jobs.get(parent)  # (it may have ended during the write)
            ended = deps.DONE if rec is None else deps.outcome_of_state(rec.state)
            if ended in FINAL:
                await self.owner.writes.delete_aux(self.ns, watch.wkey)
                return {"state": ended}
            self._hold(watch)
        return {"state": ended or deps.PENDING}

    def _hold(self, watch: Watch) -> None:
        self.watches.setdefault(watch.parent, {})[watch.wkey] = watch
        if self._watching is not None:
            self._watching()

    def on_event(self, event: JobEvent) -> None:
        """Events of this owner's queue (``features/deps.py`` routes them here)."""
        if event.kind == ev.OWNER_UP:
            self._spawn_reporter(self._recover())
            return
        if event.job_id not in self.watches:
            return
        if event.kind == ev.PURGED:
            self._spawn_reporter(self._drop(event.job_id))
            return
        outcome = ENDS.get(event.kind)
        if outcome is not None:
            self._note(event.job_id, outcome)

    def _note(self, parent: str, outcome: str) -> None:
        for watch in self.watches.get(parent, {}).values():
            self._reports.note(watch.wkey, (watch, outcome))
        self._reports.start()

    async def _send_report(self, wkey: str, report: tuple[Watch, str]) -> None:
        await self._report(*report)

    def _report_deferred(self, wkey: str, report: tuple[Watch, str], exc: IstosError) -> None:
        watch = report[0]
        log.info("queue %s: report of %s to %s deferred: %s", self.owner.name, watch.parent,
                 watch.child_id, exc)

    async def _report(self, watch: Watch, outcome: str) -> None:
        """One report, answered (or refused for good: a forged or stale watch); then a final
        outcome's watch is deleted (storage, then memory)."""
        try:
            await self._call(watch.child_queue, "dep_report", child_id=watch.child_id,
                             parent_queue=self.owner.name, parent_id=watch.parent,
                             outcome=outcome, key=watch.key)
        except (InvalidJob, JobNotFound) as exc:  # a key that proves nothing: drop the watch
            log.info("queue %s: watch of %s by %s dropped: %s", self.owner.name, watch.parent,
                     watch.child_id, exc)
            outcome = deps.DONE
        if outcome in FINAL:
            await self.owner.writes.delete_aux(self.ns, watch.wkey)
            held = self.watches.get(watch.parent, {})
            held.pop(watch.wkey, None)
            if not held:
                self.watches.pop(watch.parent, None)

    async def _drop(self, parent: str) -> None:
        for watch in list(self.watches.get(parent, {}).values()):
            await self.owner.writes.delete_aux(self.ns, watch.wkey)
        self.watches.pop(parent, None)

    async def _recover(self) -> None:
        """On start: reload the watches, report the parents that ended, and ask again about
        the parents of every waiting child."""
        jobs = self.owner.state.jobs
        for job_id, held in jobs.items():
            if held.state == WAITING:
                self._to_resolve[job_id] = None
        for _, raw in await self.owner.storage.scan(self.ns):
            parent, child_queue, child_id, key = msgpack.unpackb(raw)
            self._hold(Watch(parent, child_queue, child_id, key))
        for parent in list(self.watches):
            rec = jobs.get(parent)
            ended = deps.DONE if rec is None else deps.outcome_of_state(rec.state)
            if ended is not None:
                self._note(parent, ended)
        if self._to_resolve:
            self._resolver = asyncio.get_running_loop().create_task(self._resolve_all())

    def _spawn_reporter(self, coro: Coroutine[Any, Any, None]) -> None:
        async def quietly() -> None:
            try:
                await coro
            except IstosError as exc:
                log.warning("queue %s: dependency bookkeeping failed: %s", self.owner.name,
                            exc)
        task = asyncio.get_running_loop().create_task(quietly())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def on_stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._reports.cancel()
        if self._resolver is not None:
            self._resolver.cancel()
