"""The queue owner: binds a pure :class:`QueueState` to the node's transport, storage and clock.

It serves one request/reply key per queue and role (``{prefix}/q/{queue}/rpc/{role}``, an op
only on its role's key, so access control can grant roles apart; see docs/protocol.md),
writes every change through to storage before replying (when the storage is durable), sweeps
expired leases on a timer that sleeps until the next deadline, nudges idle workers when jobs
become claimable, and emits one :class:`JobEvent` per state change into the node's event log.
The job ops (claim, settle, ack, ...) are in ``handlers/job_ops.py``; everything else an owner
serves comes from its extensions (``extension.py``: inspection, leases, workflows, schedules).

Write, then apply (durable storage): a change counts only once its write succeeded. A failed
write puts memory back as storage holds it (:meth:`QueueState.rollback`), emits nothing, and the
request gets ``StorageUnavailable``; so a claim during an outage leases nothing and burns no
attempt, and a failed ack leaves the job leased in memory as in storage. A lease expiry whose
write fails is not applied (the sweeper retries it every sweep interval). Leases claimed before
the owner's last failed write are returned without counting their attempt when they expire:
their worker may have been unable to ack (see :meth:`QueueState.sweep`).

An HA leader passes its ``fence`` (leader lease and epoch): every write is conditional on it,
and a write refused by the fence stops the owner at once (:meth:`fenced`); the election then
reloads from storage before this replica serves again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from .. import codec, keys, protocol
from .. import events as ev
from ..core.config import QueueConfig
from ..core.expiry import start_by_of
from ..core.hungry import HungryNodes
from ..core.state import READY, QueueState
from ..core.trace_meta import without_trace
from ..errors import (
    AdminDisabled,
    ConfigError,
    FencedOut,
    InvalidJob,
    IstosError,
    ProtocolError,
)
from ..events import EventKind, JobEvent
from ..node import Node
from ..storage.base import Fence, FencedStorage, Storage, request_timeout_s
from ..wakeup import Wakeup
from ..wire_lifecycle import debounce_spec, unique_spec
from .extension import Handler, OwnerExtension, overrides
from .handle import MetaCheck
from .handlers import bulk, update
from .handlers.accept import NewJob, accept_jobs, accept_new, accept_one
from .handlers.job_ops import JobOps
from .handlers.nudges import Absorber, Nudges
from .leadership import registry
from .leadership.sole import SoleOwner
from .persistence.pause_store import PauseHooks, PauseStore
from .persistence.persist import Persister
from .persistence.write_path import UNFENCED_READS, OwnerSignals, WritePath
from .views import eventlog

log = logging.getLogger("istos.owner")
# How dispatch serves an op (Owner._how_to_serve).
_ADMIN, _DIRECT, _FENCED, _CHANGE = "admin", "direct", "fenced", "change"
_MAY_BE_CLAIMABLE = frozenset({ev.ENQUEUED, ev.RETRY_SCHEDULED, ev.UNBLOCKED})
"""Event kinds after which the job can be claimed at once (unless their ``delay_s`` is > 0)."""


_PLAIN_ENQUEUE = frozenset(("v", "op", "body", "job_id", "delay_s", "priority", "dedup_s",
                            "group", "node"))
"""The fields of an ``enqueue`` that takes the owner's plain path (see ``_op_enqueue``)."""


class QueueOwner:
    def __init__(self, config: QueueConfig, node: Node, *, fence: Fence | None = None) -> None:
        self.config = config
        self.node = node
        self.name = config.name
        self.state = QueueState(config.name, config.policy, node=node.node_id,
                                tokens=node.ids.token)
        self.durable = bool(node.storage.durable)
        if self.durable:
            self.state.track_undo()
        self.fence = fence
        # Reads of the owner's other records; their writes go through the write path
        # (``writes.apply_aux``), which writes them through this view: an HA leader's fence.
        self.storage: Storage = node.storage if fence is None else FencedStorage(
            node.storage, fence, self._storage_fenced)
        self.writes = WritePath(
            config.name, self.state, Persister(node.storage, f"jobs:{config.name}", fence=fence),
            durable=self.durable, signals=OwnerSignals(
                publish=self._publish, deadline_changed=self._sooner_deadline,
                wake_sweeper=self._wake_sweeper, write_failed=self._write_failed,
                fenced=self.fenced), aux=self.storage, clock=node.clock,
            read_wait_s=request_timeout_s(node.storage))
        self.failed_at: float | None = None  # clock time of the last failed write
        # An HA leader's view of its lease: it serves only until then unless renewed, and
        # wakes the election when it finds it lapsed or its epoch gone.
        self._lease_until = float("inf")
        self._wake_election: Callable[[], None] | None = None
        self._handle: Any = None
        self._rpc_base = ""
        self.sole: SoleOwner | None = None  # a non-HA owner's token (leadership/sole.py)
        self._timer: asyncio.Task[None] | None = None
        self._reschedule = Wakeup()
        self._timer_target = float("inf")
        # Worker nodes whose last claim left slots empty, and how many: a nudge wakes only
        # as many of them as there are new jobs (the reference woke every idle loop per job).
        self.hungry = HungryNodes()
        self._meta_check: MetaCheck | None = None  # check_meta_with (the workflow code)
        self.rejects = protocol.RejectLog(log.warning)
        self.extensions: list[OwnerExtension] = []  # see extend()
        self._before_ack: list[OwnerExtension] = []
        self._before_every_ack: list[OwnerExtension] = []  # those not only for jobs with meta
        self._on_stop: list[OwnerExtension] = []
        self._on_nudge: list[OwnerExtension] = []
        self.nudges = Nudges(node, self.name, self.hungry, self._on_nudge, lambda: self.running)
        self.running = False
        # Stored pauses of the queue and its groups (persistence/pause_store.py), loaded at start.
        self.pauses = PauseStore(self.name, node.node_id, self.state, self.storage, self.writes,
                                 durable=self.durable, clock=node.clock,
                                 hooks=PauseHooks(node.events.emit, self.nudge))
        self.job_ops = JobOps(self)
        self._ops: dict[str, Handler] = {
            "enqueue": self._op_enqueue, **self.job_ops.ops(), "ping": self._op_ping,
            "enqueue_many": lambda msg: bulk.op_enqueue_many(self, msg),
            "update": lambda msg: update.op_update(self, msg),
        }
        # The handler of each op for a request that carries no ``meta``: the same as ``_ops``
        # except where an extension wraps an op for meta-carrying requests only
        # (``meta_only_wraps``), so a plain enqueue never passes through them.
        self._plain_ops: dict[str, Handler] = dict(self._ops)
        # op -> (handler, handler without meta, how dispatch serves it): worked out at the
        # op's first request after an extension changed the tables (_route).
        self._routes: dict[str, tuple[Handler, Handler, str]] = {}

    def before_ack_hooks(self, with_meta: bool) -> list[OwnerExtension]:
        """The extensions whose ``before_ack`` runs for an ack of a job with (or without) meta,
        in order; those that asked for workflow steps only skip jobs without meta."""
        return self._before_ack if with_meta else self._before_every_ack

    def extend(self, ext: OwnerExtension, *, first: bool = False) -> None:
        """Install one extension (:mod:`istos.owner.extension`): each op it ``wraps`` is
        served by its wrapper around the handler serving it so far, each op it ``serves`` by
        its handler (replacing one of that name: a test's stand-in); its hooks run after those
        of the extensions installed before it (``first``: before). An app installs its
        extensions once, in the declared order (:func:`istos.owner.composition.compose`).

        Raises:
            ConfigError: the extension wraps an op nobody serves yet, or its ``ops()`` are
                not the ops it declares it ``serves``.
        """
        served = ext.ops()
        if set(served) != set(ext.serves):
            raise ConfigError(f"owner extension {ext.name or type(ext).__name__!r} declares it "
                              f"serves {sorted(ext.serves)} but its ops() are {sorted(served)}")
        for op in ext.wraps:
            inner = self._ops.get(op)
            if inner is None:
                raise ConfigError(f"owner extension {ext.name or type(ext).__name__!r} wraps "
                                  f"{op!r}, which nothing installed before it serves")
            self._ops[op] = ext.wrap(op, inner)
            if op not in ext.meta_only_wraps:
                # A wrapper for every request, above a meta-only one: no request bypasses it.
                self._plain_ops[op] = self._ops[op]
        self._ops.update(served)
        self._plain_ops.update(served)
        self._routes.clear()
        for hook, hooked in (("before_ack", self._before_ack), ("on_stop", self._on_stop),
                             ("on_nudge", self._on_nudge)):
            if overrides(ext, hook):
                hooked.insert(0 if first else len(hooked), ext)
        self._before_every_ack = [e for e in self._before_ack if not e.before_ack_meta_only]
        self.extensions.append(ext)

    def handler(self, op: str) -> Handler | None:
        """The handler serving ``op`` now (None: the owner does not serve it)."""
        return self._ops.get(op)

    # -- the handle's named registrations (what extensions may change of the owner) --
    def check_meta_with(self, check: MetaCheck) -> None:
        """Accept enqueues with job meta or a reserved id only once ``check`` passed them
        (the workflow code installs it; without one such enqueues are refused)."""
        self._meta_check = check

    def absorb_nudges(self, absorber: Absorber) -> None:
        """Hand the nodes chosen for each nudge to ``absorber`` too (parked claims)."""
        self.nudges.add_absorber(absorber)

    def lead_until(self, deadline: float) -> None:
        """An HA leader serves until ``deadline`` (its leader lease, by its clock) unless
        renewed before; past it every request is refused and the election woken."""
        self._lease_until = deadline

    def wake_election_with(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` when this leader finds its lease lapsed or its epoch gone."""
        self._wake_election = wake

    # -- lifecycle --
    async def start(self) -> None:
        """Recover from durable storage, bind the rpc key, start the sweeper."""
        if self.node.transport is not None and self.fence is None and not self.config.ha:
            self.sole = SoleOwner(self.node, self.name)
            await self.sole.claim()  # OwnerConflict: another node serves this queue
        now = self.node.clock.now()
        if self.durable:
            records, marks = await self.writes.persister.load_all()
            for rec in records:
                self.state.restore(rec, now)
            for mark in marks:
                self.state.restore_mark(mark)
            await self.pauses.load()
        self.running = True
        if self.node.transport is not None:
            # rpc/** (not rpc/*): a request on a malformed rpc key (no role, or chunks past
            # it) reaches this owner too and gets a ProtocolError rather than silence. Queue
            # names hold no "rpc" chunk (check_queue_name), so these keys are this queue's.
            self._rpc_base = keys.rpc_base(self.node.prefix, self.name)
            self._handle = await self.node.transport.declare_queryable(
                self._rpc_base + "/**", self._on_request)
        self._timer = asyncio.get_running_loop().create_task(self._sweep_loop())
        registry.add(self)
        self._emit_queue_event(ev.OWNER_UP, recovered=len(self.state.jobs))
        self.writes.after_change()

    def _unbind(self) -> None:
        """Stop answering requests and cancel the sweeper (``stop`` then awaits it)."""
        self.running = False
        registry.remove(self)
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._timer is not None:
            self._timer.cancel()
        if self.sole is not None:
            self.sole.release()

    async def stop(self) -> None:
        self._unbind()
        if self._timer is not None:
            await asyncio.gather(self._timer, return_exceptions=True)
            self._timer = None
        self._emit_queue_event(ev.OWNER_DOWN)
        for ext in self._on_stop:
            ext.on_stop()

    def kill(self) -> None:
        """Stop at once without emitting or writing anything (a simulated crash)."""
        self.running = False
        registry.remove(self)
        if self._timer is not None:
            self._timer.cancel()

    # -- the request path --
    async def _on_request(self, key: str, payload: bytes) -> bytes:
        """Serve one request from the mesh. A replica that is not (or no longer) the epoch's
        leader raises instead, which the mesh turns into an error reply: a client takes the
        first *ok* reply, so the live leader's answer wins over a stand-in's."""
        self._check_leading()
        try:
            msg = codec.decode_message(payload)
        except ProtocolError as exc:
            self._rejected("?", "undecodable", exc)
            return codec.encode_message(error_reply(exc))
        role = protocol.role_in_key(self._rpc_base, key)
        if role is None:
            bad = ProtocolError(f"queue {self.name!r}: requests go to {self._rpc_base}/<role> "
                                f"with a role of {', '.join(protocol.ROLES)}; got key "
                                f"{key[:200]!r}")
            self._rejected("?", "bad-key", bad)
            return codec.encode_message(error_reply(bad))
        reply = await self.dispatch(msg, role=role)
        self._check_leading()
        return protocol.encode_reply(reply)

    def _check_leading(self) -> None:
        if self.fence is None:
            return
        if not self.running:
            raise FencedOut(f"queue {self.name!r}: this replica no longer leads")
        if self.node.clock.now() >= self._lease_until:
            if self._wake_election is not None:
                self._wake_election()  # renew now
            raise FencedOut(f"queue {self.name!r}: this replica's leader lease lapsed")

    async def dispatch(self, msg: dict[str, Any], *, trusted: bool = False,
                       role: str | None = None) -> dict[str, Any]:
        """Run one request (already decoded) and build its reply; never raises.

        The request is checked against its op's schema (:mod:`istos.protocol`) before its
        handler runs, so a malformed one changes nothing. ``trusted`` (this node's own app
        calling in-process, with fields it built from checked values) skips that check, not
        the admin rule. ``role``: the role key a request from the mesh arrived on; an op of
        another role is refused; without a role (an in-process caller) a reply some read op
        built from packed entries (:class:`codec.Spliced`) comes back as plain values.
        """
        try:
            op = msg["op"] if trusted else \
                protocol.check_request(msg, self._ops.__contains__)
            if role is not None:  # from the mesh: on the key of the op's role only
                protocol.check_role(op, role)
        except IstosError as exc:
            peer = msg.get("node") if isinstance(msg, dict) else None
            self._rejected(peer if isinstance(peer, str) else "?",
                           str(msg.get("op"))[:40] if isinstance(msg, dict) else "?", exc)
            return error_reply(exc)
        route = self._routes.get(op) or self._route(op)
        if route is None:
            return error_reply(ProtocolError(f"unknown op {op!r} for queue {self.name!r}"))
        handler = route[1] if msg.get("meta") is None else route[0]
        how = route[2]
        try:
            if how == _ADMIN:
                self.require_admin(op)
                how = self._how_to_serve(op, admin_checked=True)
            if how == _DIRECT:
                reply = await handler(msg)
            elif how == _FENCED:
                # The read fence: the reply reports only what storage holds (write_path.py).
                reply = await self.writes.read(handler, msg)
            else:
                self.writes.begin_change()
                try:
                    reply = await handler(msg)
                finally:
                    self.writes.end_change()
        except IstosError as exc:
            return error_reply(exc)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("queue %s: bad %s request: %r", self.name, op, exc)
            return error_reply(ProtocolError(f"bad {op} request: {exc!r}"))
        reply.setdefault("ok", True)
        reply["v"] = codec.PROTOCOL_VERSION
        if role is None and type(reply) is codec.Spliced:
            return reply.plain()  # in-process: the caller reads values, never the bytes
        return reply

    def _route(self, op: str) -> tuple[Handler, Handler, str] | None:
        """``op``'s entry of :attr:`_routes`, made now (None: nobody serves ``op``)."""
        handler = self._ops.get(op)
        if handler is None:
            return None
        route = self._routes[op] = (handler, self._plain_ops[op], self._how_to_serve(op))
        return route

    def _how_to_serve(self, op: str, *, admin_checked: bool = False) -> str:
        """How :meth:`dispatch` serves ``op`` (worked out once per op, then looked up): only
        after the admin check (admin ops); directly (events are published only once stored;
        a volatile queue's memory is all there is, so it has no write to wait for nor a
        change to hand over); behind the read fence (reads); or counted as a change."""
        if op in protocol.ADMIN_OPS and not admin_checked:
            return _ADMIN
        if op in UNFENCED_READS or not self.writes.durable:
            return _DIRECT
        return _FENCED if protocol.role_of(op) == "read" else _CHANGE

    def _rejected(self, peer: str, kind: str, exc: IstosError) -> None:
        self.rejects.note(peer, f"{kind}/{type(exc).__name__}", f"queue {self.name}: {exc}",
                          self.node.clock.monotonic())

    async def _op_ping(self, msg: dict[str, Any]) -> dict[str, Any]:
        return {"node": self.node.node_id, "queue": self.name}

    async def _op_enqueue(self, msg: dict[str, Any]) -> dict[str, Any]:
        job_id = msg.get("job_id") or self.node.ids.new()
        if _PLAIN_ENQUEUE.issuperset(msg) and not job_id.startswith(
                protocol.RESERVED_ID_PREFIXES):
            # The common request (no meta, key, burst or deadline) skips those steps: a queue
            # that uses none of them pays for none of them.
            job = NewJob(job_id, msg["body"], float(msg.get("delay_s", 0.0)),
                         msg.get("priority", 0), None, msg.get("dedup_s"), msg.get("group"))
            # (accept_jobs, not accept_new: its keyed=False branch, one coroutine frame less)
            if (await accept_jobs(self, (job,), share_twin_fate=True, keyed=False))[0][0]:
                return {"job_id": job_id, "created": True}
            return {"job_id": job_id, "created": False, "reason": "job_id"}
        meta = msg.get("meta")
        flow = without_trace(meta)  # a trace context alone is no workflow (core/trace_meta)
        if (flow is not None or job_id.startswith(protocol.RESERVED_ID_PREFIXES)) \
                and not self.state.holds(job_id):
            # Workflow metadata makes the owner (or a worker) enqueue follow-up jobs, so only
            # shapes the workflow code writes are accepted, checked before anything is stored;
            # workflow and schedule ids (wf:, sched:) only with their proof.
            if self._meta_check is None:
                raise InvalidJob(f"queue {self.name!r} accepts no job meta")
            await self._meta_check(job_id, flow)
        protocol.one_deadline(msg)
        unique, burst = msg.get("unique"), msg.get("debounce")
        job = NewJob(job_id, msg["body"], float(msg.get("delay_s", 0.0)),
                     msg.get("priority", 0), meta, msg.get("dedup_s"), msg.get("group"),
                     None if unique is None else unique_spec(unique),
                     None if burst is None else debounce_spec(burst),
                     start_by=start_by_of(msg, self.node.clock.now()))
        return await accept_one(self, job)

    async def enqueue(self, body: bytes, *, job_id: str, delay_s: float = 0.0,
                      priority: int = 0, meta: dict[str, Any] | None = None,
                      dedup_s: float | None = None, group: str | None = None,
                      start_by: float | None = None) -> bool:
        """Accept a job; returns False when the queue already holds ``job_id`` (idempotent),
        or holds it reserved (a dedup window, ``core/dedup.py``). The one path of new jobs
        (``handlers/accept.py``): with durable storage the record is stored before the queue accepts
        it, so a storage outage makes the enqueue fail (StorageUnavailable) and nothing
        half-accepted remains in memory; a twin of ``job_id`` in flight decides this one."""
        job = NewJob(job_id, body, delay_s, priority, meta, dedup_s, group, start_by=start_by)
        return (await accept_new(self, [job], share_twin_fate=True))[0]

    # -- admin helpers shared with inspection --
    def require_admin(self, action: str) -> None:
        if not self.config.admin:
            raise AdminDisabled(f"{action} refused: queue {self.name!r} was declared without "
                                "admin=True")

    # -- what the write path tells the owner --
    def _write_failed(self) -> None:
        self.failed_at = self.node.clock.now()

    def _storage_fenced(self) -> None:
        self.failed_at = self.node.clock.now()
        self.fenced()

    def _sooner_deadline(self) -> None:
        if self.state.next_deadline_hint() < self._timer_target:
            self._reschedule.set()

    def _wake_sweeper(self) -> None:
        if self.running:
            self._reschedule.set()

    def fenced(self) -> None:
        """Another replica holds the leadership epoch: stop serving at once (no write, no
        event), and tell the election, which reloads before this replica serves again."""
        if not self.running:
            return
        log.warning("queue %s: lost the leadership epoch; stopping at once", self.name)
        self._unbind()
        if self._wake_election is not None:
            self._wake_election()

    def _publish(self, events: list[JobEvent]) -> None:
        emit = self.node.events.emit
        claimable = 0
        for event in events:
            emit(event)
            if event.kind in eventlog.LOGGED:
                eventlog.log_event(self.name, event, self.state.jobs.get(event.job_id))
            if event.kind in _MAY_BE_CLAIMABLE and event.detail.get("delay_s", 0) <= 0:
                claimable += 1
        if claimable:
            self.nudge(claimable)

    def _emit_queue_event(self, kind: EventKind, **detail: Any) -> None:
        self.node.events.emit(JobEvent(self.node.clock.now(), self.node.node_id, self.name, "",
                                       kind, 0, None, detail))

    def nudge(self, count: int) -> None:
        """Tell idle workers that ``count`` jobs became claimable (``handlers/nudges.py``)."""
        self.nudges.nudge(count)

    # -- the sweeper --
    async def _sweep_loop(self) -> None:
        clock, interval = self.node.clock, self.config.sweep_interval_s
        while self.running:
            now = clock.now()
            deadline = self.state.next_deadline()
            # Nothing timed to do: sleep until a change brings a deadline (no idle ticking).
            # Otherwise wake at the deadline, but at least every sweep interval, so a wall
            # clock that jumps cannot leave an expired lease unnoticed for long.
            wait = None if deadline is None else min(interval, max(0.0, deadline - now))
            self._timer_target = float("inf") if wait is None else now + wait
            self._reschedule.clear()
            if wait is None or wait > 0:
                await self._reschedule.wait(None if wait is None else clock.to_loop_seconds(wait))
            self._timer_target = float("inf")
            now = clock.now()
            before = self.state.counts[READY]
            self.state.sweep(now, spare_claimed_by=self.failed_at)
            promoted = self.state.counts[READY] - before
            dirty, events = self.state.drain()
            if self.durable and dirty:
                if not await self.writes.write_quietly(dirty, events, self.state.take_undo()):
                    # Not applied (rolled back): retry after a sweep interval, not in a spin.
                    await clock.sleep(interval)
                    continue
            else:
                self._publish(events)
            if promoted > 0:
                self.nudge(promoted)

    # -- read-only views --
    def stats(self) -> dict[str, Any]:
        counts = dict(self.state.counts)
        oldest = self.state.oldest_ready_at()
        now = self.node.clock.now()
        return {"queue": self.name, "node": self.node.node_id, "counts": counts,
                "oldest_ready_age_s": None if oldest is None else max(0.0, now - oldest),
                "paused": self.state.paused, **self.pauses.stats()}


error_reply = protocol.error_reply
