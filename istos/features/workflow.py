"""Chain, group and chord: multi-step work composed from plain queue jobs.

Every workflow job is an ordinary job carrying a ``meta`` dict that travels with it (and is
persisted with it), so workflows inherit the queue's guarantees: leases, retries, backoff,
dead letters, durability. Nothing here adds a coordinator; the pieces are:

**Proof** (:mod:`istos.core.workflow_meta`). A chain or chord starts with a random ``key``;
its id (``wf:`` + 32 hex digits) is a hash of the key and the workflow's fixed parts, every job
of it carries the key in its meta, and owners recompute the id before accepting one. Reads never
show the key, so an id read from ``jobs`` or a dead letter cannot continue, redirect or pre-empt
a workflow, and a plain enqueue may not create ``wf:`` ids at all.

**Chain** (:meth:`Workflows.chain`). Step 0 is enqueued on ``queues[0]`` with ``meta={"chain":
{"id", "queues", "step", "priority", "key"}}`` and job id ``f"{chain_id}.0"``. When a step's
function returns, the worker calls :meth:`Workflows.continue_after`, which enqueues the return
value on the next queue as step ``step + 1`` with job id ``f"{chain_id}.{step + 1}"``, *before* the
step is acked. A crash between the two redelivers the step, never loses the chain; the redelivered
step re-enqueues its continuation under the same id, which idempotent enqueue drops while the next
step is still held (once the next step has been acked and forgotten, a redelivery runs it again:
at-least-once, as everywhere in the queue). A step that raises is retried like any job; a step that
dead-letters ends the chain, and its dead letter's ``"workflow"`` entry names the chain id and
step. Continuations keep the chain's priority.

**Group** (:meth:`Workflows.group`): each item becomes one job on one queue; the ids come
back in item order. Every item is encoded before any is sent, so a bad item enqueues nothing.

**Chord** (:meth:`Workflows.chord`): a group whose members carry ``meta={"chord": {"id", "index",
"size", "callback", "input", "key"}}`` (job ids ``f"{chord_id}.{index}"``). Its callback is first
reserved on the callback queue's owner (``chord_reserve``, ``chord_callbacks.py``), which the
barrier's owner checks before it opens the barrier, so no owner fires a callback into a queue that
did not expect it. The barrier lives on the member queue's owner: an ack hook stores each member's
result (the encoded bytes the worker sends with its ack) at its index in a barrier record, in the
owner's storage (namespace ``wf:{queue}``, key = chord id), *before* the ack is recorded. When all
``size`` results are present, the hook enqueues the callback on the callback queue with
``{"results": [... in member order ...], "input": extra}`` and job id ``f"{chord_id}.callback"``,
then marks the barrier fired. The callback fires once even when members are redelivered: results
are keyed by index (storing one twice changes nothing), a per-chord lock serialises the
read-modify-write, the fired flag stops a second firing, and the deterministic callback id
deduplicates a firing repeated after a crash while the callback job is held. The lock is never
held across the callback's enqueue (a request to the callback queue's owner, maybe another
node): the ack that completes the barrier decides under it, sends with no lock held, then
stores the tombstone under it again. Meanwhile a repeated ack of that member waits for the
firing's outcome, and any other member's ack goes through at once (the sender's ack fails if
the enqueue fails: it is redelivered and fires again). A late answer from a
delivery whose lease was already re-issued is stale and never reaches the barrier. An empty chord
enqueues its callback at once with ``results == []``.

Barriers are cached in memory per owner and loaded from storage on a miss, so with durable
storage they survive an owner restart; storage is written through even when it is the volatile
in-memory default. A fired barrier shrinks to a tombstone (size and fired flag, results dropped,
since they now live in the callback job); the owner deletes its tombstones after
``TOMBSTONE_TTL_S`` of its clock, long after any member could come back. Tombstones of chords
fired just before an owner restart are not tracked by the new owner and stay (a few bytes each).

**A dead member stalls its chord**, observably. Its owner (the barrier's) records it in the
barrier (``dead``: member index -> when, written through the write path like the results),
emits a ``chord`` event (``change: "stalled"``, the chord id, the member's index, the chord's
size, ``stalled_by``: every member stalling it) and logs a warning; ``why`` of any member then
says the chord is stalled by that member, dead, and that ``revive`` resumes it. A (re)started
owner brings the records up to date with its jobs (a member that died or was revived just
before a crash). ``app.enqueue(queue, dead["data"])`` makes a NEW job without chord meta, which
will run but will NOT release the chord. :meth:`Workflows.revive` (or ``redrive_dead``) moves
the dead job itself back to ready, under the same id with its data and meta: the barrier no
longer lists it (a ``chord`` event, ``change: "resumed"``), and the chord can finish.

**A chord's ends** (``on_death``, ``on_complete``) are a batch's callbacks
(:mod:`istos.features.batch`): given either, ``app.chord`` opens a batch at the ends' queue,
counts each member there before enqueueing it (its meta then holds ``"batch"`` beside
``"chord"``, both proven by :meth:`ChordBarriers.check_meta`) and closes it. The batch code
does the rest unchanged: each member's owner reports its end to the batch's home, which fires
``on_death`` at the first dead member and ``on_complete`` once none is pending, exactly once
across restarts. The chord's barrier and callback are untouched, so a chord with a dead member
ends observably (those two callbacks, and ``istos batch``) instead of staying silently open.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import msgpack

from .. import codec, protocol
from .. import events as ev
from ..core import batch_state as bs
from ..core import workflow_meta as wf
from ..core.chord_barrier import Barrier
from ..core.config import check_priority, check_queue_name
from ..core.records import CANCELLED, DEAD
from ..core.state import JobRecord
from ..core.workflow_meta import check_workflow_meta
from ..deprecation import renamed
from ..errors import (
    ConfigError,
    InvalidJob,
    IstosError,
    JobNotFound,
    OwnerUnavailable,
    ProtocolError,
)
from ..events import JobEvent
from ..owner.extension import Hooks, OwnerExtension
from ..payload import compose
from .chord_callbacks import CallbackReservations, ExpectsAsker

if TYPE_CHECKING:
    from ..client import OwnerClient
    from ..node import Node
    from ..owner.handle import OwnerHandle
    from .batch import Batch

log = logging.getLogger("istos.workflow")

TOMBSTONE_TTL_S = 86_400.0
"""How long (owner clock) a fired chord's tombstone is kept before the owner deletes it."""
RETRY_MIN_S, RETRY_MAX_S = 0.5, 30.0  # backoff of a stall's record whose write failed
_ROUTED = frozenset({ev.OWNER_UP, ev.DEAD_LETTERED, ev.CANCELLED, ev.ENQUEUED})

_NIL = msgpack.packb(None)  # a member result the worker did not send decodes as None


class Enqueue(Protocol):
    """The app's ``enqueue``, as far as workflows use it (``_meta``: the workflow's meta)."""

    async def __call__(self, name: str, data: Any, *, priority: int = 0,
                       job_id: str | None = None,
                       _meta: dict[str, Any] | None = None) -> str: ...


class Workflows:
    """``chain``, ``group``, ``chord`` and ``revive`` of one app (``app.workflows``).

    Built on the app's ``enqueue``, its per-queue ``client`` and its ``require_serving``
    check; :meth:`owner_extension` is the owner side (chord barriers, ``revive``'s op) on
    each owner the app starts, and :meth:`continue_after` is the worker's continuation hook.
    """

    def __init__(self, node: Node, enqueue: Enqueue, client: Callable[[str], OwnerClient],
                 require_serving: Callable[[], None],
                 open_batch: Callable[..., Awaitable[Batch]] | None = None) -> None:
        self.node = node
        self.enqueue = enqueue
        self.client = client
        self._require_serving = require_serving
        self.open_batch = open_batch  # app.batch: a chord's on_death / on_complete
        self._barriers: dict[str, ChordBarriers] = {}  # queue -> its owner's barriers
        # Enqueues matter only while a chord is stalled (a revival may resume it): that
        # subscription waits for the first stall (watch_revivals), so a plain enqueue on a
        # node with no stalled chord pays nothing here.
        node.events.subscribe(self._route, _ROUTED - {ev.ENQUEUED})
        self._revivals_routed = False

    # -- producer calls --
    async def chain(self, queues: list[str], data: Any, *, priority: int = 0) -> str:
        """Run ``queues`` in sequence, piping each step's return value into the next step.

        Returns the first job's id, ``f"{chain_id}.0"`` (the chain id is the part before the last
        dot). Raises :class:`ConfigError` for an empty list or a bad queue name, and whatever
        :meth:`enqueue` raises for the first step.
        """
        if isinstance(queues, str) or not isinstance(queues, (list, tuple)) or not queues:
            raise ConfigError(f"chain needs a non-empty list of queue names, got {queues!r}")
        names = [check_queue_name(q) for q in queues]
        prio = check_priority(priority)
        key = self.node.ids.token()  # the chain's proof: its steps carry it, reads never show it
        chain_id = wf.chain_id(key, names, prio)
        meta = {"chain": {"id": chain_id, "queues": names, "step": 0, "priority": prio,
                          "key": key}}
        return await self.enqueue(names[0], data, priority=prio, job_id=f"{chain_id}.0",
                                  _meta=meta)

    async def group(self, queue: str, items: list[Any], *, priority: int = 0) -> list[str]:
        """Enqueue each item as one job on ``queue``; return their ids in item order.

        Every item is encoded first, so an item msgpack cannot encode raises
        :class:`InvalidJob` before any job is sent. Not atomic against an owner failing midway:
        the ids enqueued before an :class:`OwnerUnavailable` stay enqueued. Raises
        :class:`ConfigError` for a bad queue name or priority, and what :meth:`enqueue`
        raises.
        """
        check_queue_name(queue)
        prio = check_priority(priority)
        items = list(items)
        for item in items:
            codec.encode_body(item, queue=queue)
        return [await self.enqueue(queue, item, priority=prio) for item in items]

    async def chord(self, queue: str, items: list[Any], *, callback: tuple[str, Any],
                    priority: int = 0, on_death: tuple[str, Any] | None = None,
                    on_complete: tuple[str, Any] | None = None) -> str:
        """Run ``items`` on ``queue``; when all succeed, enqueue the callback once.

        ``callback`` is ``(callback_queue, extra)``; the callback job's body is
        ``{"results": [one per item, in item order], "input": extra}``. Returns the chord id.
        The callback fires only once every member is done: a dead member holds it back until
        :meth:`revive` brings the member back and it succeeds. Without ``on_death`` and
        ``on_complete`` nothing else happens on its own, but the stall is observable: the
        member queue's owner records it (durably, in the chord's barrier), emits a ``chord``
        event (``change: "stalled"``, the dead member's job id and index) and ``why`` of any
        member says which member stalls the chord and that ``revive`` resumes it. To react to
        a dead member in code, give ``on_death`` or ``on_complete``.

        ``on_death`` and ``on_complete`` (each ``(queue, data)``, optional) say how the chord
        ended, with the semantics of :meth:`~istos.features.batch.Batches.batch`'s callbacks:
        ``on_death`` fires once at the first member dead-lettered, ``on_complete`` once every
        member is done or dead (also when all are done). Given either, the members also form
        a closed batch (its description ``"chord <chord id>"``, its home the queue of
        ``on_complete``, else of ``on_death``) whose callback bodies are a batch's
        (``batch_id``, ``kind``, counts, ``input``); ``istos batch`` shows its members.

        Raises :class:`ConfigError` for a malformed callback and :class:`InvalidJob` (before
        anything is sent) for an item or ``extra`` msgpack cannot encode; with ``on_death`` or
        ``on_complete``, what opening and adding to a batch raises.
        """
        check_queue_name(queue)
        prio = check_priority(priority)
        if not isinstance(callback, (tuple, list)) or len(callback) != 2:
            raise ConfigError(f"chord callback must be a (queue, input) pair, got {callback!r}")
        ends = {k: v for k, v in (("on_complete", on_complete), ("on_death", on_death))
                if v is not None}
        if ends and self.open_batch is None:
            raise ConfigError("this app's chords take no on_death/on_complete (no batches)")
        cb_queue, extra = check_queue_name(callback[0]), callback[1]
        items = list(items)
        codec.encode_body(extra, queue=cb_queue)
        if self.node.payload.codecs:  # members carry it in meta, which storage holds: encode
            extra = self.node.payload.encode_body(extra, queue=cb_queue)
        for item in items:
            codec.encode_body(item, queue=queue)
        key = self.node.ids.token()
        chord_id = wf.chord_id(key, queue, len(items), cb_queue)
        # Member meta also carries the batch entry ({id, home, key}) when the chord has ends:
        # a placeholder of its largest size is measured with the rest.
        home = _ends_home(ends)
        sizer = {} if home is None else {
            "batch": {"id": bs.batch_id(key, home), "home": home, "key": key}}
        if items:
            try:  # the largest member meta, checked before anything is sent
                protocol.meta("chord meta", {"chord": {
                    "id": chord_id, "index": len(items), "size": len(items),
                    "callback": cb_queue, "input": extra, "key": key}, **sizer})
            except ProtocolError as exc:
                raise InvalidJob(f"chord on queue {queue!r}: {exc}") from None
        # The callback queue's owner expects the callback: asked on its produce key, so only
        # an opener that may enqueue there can aim a chord at it (chord_callbacks.py).
        await self.client(cb_queue).call("chord_reserve", chord_id=chord_id,
                                         member_queue=queue, size=len(items), key=key)
        # The chord's ends are a batch's: its home counts each member's end (reported by the
        # member's owner, as for any batch member) and fires on_death / on_complete once.
        batch = None if not ends or self.open_batch is None else await self.open_batch(
            description=f"chord {chord_id}", **ends)
        if not items:
            await self.enqueue(cb_queue, {"results": [], "input": callback[1]}, priority=prio,
                               job_id=f"{chord_id}.callback", _meta=callback_meta(
                                   chord_id, queue, 0, key))
            if batch is not None:
                await batch.close()  # empty and closed: on_complete fires at once
            return chord_id
        # The member queue's owner holds the barrier before any member exists: it refuses
        # chord meta pointing at a barrier it does not hold.
        await self.client(queue).call("chord_open", chord_id=chord_id, size=len(items),
                                      callback=cb_queue, key=key)
        for index, item in enumerate(items):
            job_id = f"{chord_id}.{index}"
            meta: dict[str, Any] = {"chord": {"id": chord_id, "index": index,
                                              "size": len(items), "callback": cb_queue,
                                              "input": extra, "key": key}}
            if batch is not None:
                meta["batch"] = await batch.count(queue, job_id)
            await self.enqueue(queue, item, priority=prio, job_id=job_id, _meta=meta)
        if batch is not None:
            await batch.close()
        return chord_id

    async def revive(self, queue: str, job_id: str) -> str:
        """Move dead job ``job_id`` of ``queue`` back to ready under its own id; returns its id.

        The job keeps its id, data, priority and ``meta`` (so a chord member still counts
        towards its chord, and a chain step still continues its chain) and starts afresh:
        attempt count 0, no ``last_error``, empty history. The old attempts stay visible in
        the event stream (``dead_lettered``, then ``enqueued`` under the same id). Works against
        a remote owner. Raises :class:`JobNotFound` if the queue holds no dead job of that id.

        This is deliberate, like re-enqueueing a dead letter by hand: fix the cause first.
        It changes a job's fate, so the owner's queue must be declared with ``admin=True``
        (:class:`AdminDisabled` otherwise), like ``resubmit`` and ``purge_dead``.
        A plain ``enqueue`` of the dead job's data (or ``LiveQueue.resubmit``, a copy under a
        new id) is a different job with no workflow meta and does not release a stalled chord.
        Sent as the ``requeue_dead`` op.
        """
        check_queue_name(queue)
        self._require_serving()
        reply = await self.client(queue).call("requeue_dead", job_id=job_id)
        if reply.get("status") != "requeued":
            raise JobNotFound(f"queue {queue!r} holds no dead job {job_id!r} (its state: "
                              f"{reply.get('state', 'unknown')}); nothing was revived")
        return str(reply["job_id"])

    def requeue_dead(self, queue: str, job_id: str) -> Coroutine[Any, Any, str]:
        """Deprecated alias of :meth:`revive` (kept one release): warns with a
        :class:`DeprecationWarning`, then is that call, raising what it raises."""
        renamed("requeue_dead", "revive")
        return self.revive(queue, job_id)

    # -- hooks --
    def owner_extension(self, owner: OwnerHandle) -> OwnerExtension:
        """Serve chords (barriers, ``chord_open``) and :meth:`revive` (the ``requeue_dead``
        op) on ``owner``; its enqueues with workflow meta are checked by the chord barriers."""
        barriers = ChordBarriers(owner, self)
        owner.check_meta_with(barriers.check_meta)
        self._barriers[owner.name] = barriers  # a restarted owner's replace the old ones

        async def revive(msg: dict[str, Any]) -> dict[str, Any]:
            reply = await revive_op(owner, msg["job_id"])  # admin-gated by dispatch
            if reply["status"] == "requeued":
                await barriers.revived(msg["job_id"])  # the stall it caused is over
            return reply

        return Hooks(name="workflows",
                     ops={"chord_open": barriers.op_open, "requeue_dead": revive,
                          "chord_reserve": barriers.callbacks.op_reserve,
                          "chord_expects": barriers.callbacks.op_expects},
                     before_ack=barriers.on_ack, before_ack_meta_only=True,
                     on_stop=barriers.on_stop)

    def watch_revivals(self) -> None:
        """A chord on one of this node's owners is stalled: route enqueues (revivals) too,
        from now on."""
        if not self._revivals_routed:
            self._revivals_routed = True
            self.node.events.subscribe(self._route, (ev.ENQUEUED,))

    def _route(self, event: JobEvent) -> None:
        """This node's events that concern chord barriers, to the barriers of their queue."""
        barriers = self._barriers.get(event.queue)
        if barriers is None or not barriers.owner.running \
                or (event.kind == ev.ENQUEUED and not barriers.stalled):
            return  # (every enqueue passes here: only one while a chord is stalled goes on)
        barriers.on_event(event)

    async def continue_after(self, meta: dict[str, Any], result: Any) -> None:
        """Run by a worker after its function returned and before it acks: the next step of
        a chain is enqueued first, so a crash between the two never cuts the chain."""
        step = meta.get("chain")
        if step is not None:
            await self._continue_chain(step, result)

    async def _continue_chain(self, step: dict[str, Any], result: Any) -> None:
        queues, index = step["queues"], int(step["step"])
        if index + 1 >= len(queues):
            return  # the last step: the chain is complete
        nxt = {**step, "step": index + 1}
        # Raising here (owner unreachable, result not encodable) fails the step, so it is
        # retried and the chain is never silently cut.
        await self.enqueue(queues[index + 1], result, priority=int(step.get("priority", 0)),
                           job_id=f"{step['id']}.{index + 1}", _meta={"chain": nxt})


def _ends_home(ends: dict[str, Any]) -> str | None:
    """The home queue of a chord's batch (the first of ``on_complete``, ``on_death``), None
    without either. Raises :class:`ConfigError` for a spec that is not a ``(queue, data)``
    pair or a bad queue name."""
    for kind, spec in ends.items():
        if not isinstance(spec, (tuple, list)) or len(spec) != 2:
            raise ConfigError(f"chord {kind} must be a (queue, data) pair, got {spec!r}")
        check_queue_name(spec[0])
    return next((str(spec[0]) for spec in ends.values()), None)


def callback_meta(chord_id: str, queue: str, size: int, key: str) -> dict[str, Any]:
    """The meta of a chord's callback job: the proof its callback queue's owner checks."""
    return {"callback": {"id": chord_id, "queue": queue, "size": size, "key": key}}


async def revive_op(owner: OwnerHandle, job_id: str) -> dict[str, Any]:
    """The owner side of :meth:`Workflows.revive` (the ``requeue_dead`` op)."""
    state = owner.state
    if state.revive_dead(job_id, owner.node.clock.now()) is None:
        held = state.jobs.get(job_id)
        return {"status": "not_dead", "state": held.state if held is not None else "unknown"}
    await owner.writes.commit()
    return {"status": "requeued", "job_id": job_id}


@dataclass
class _Firing:
    """A chord's callback enqueue in flight: the member whose ack sends it, and its outcome
    (which a repeated ack of that member awaits)."""

    job_id: str
    outcome: asyncio.Future[None]


def _settle(outcome: asyncio.Future[None], exc: BaseException) -> None:
    """Fail ``outcome`` with ``exc`` (an :class:`IstosError` as it is, anything else, such as
    the sender's cancellation, as :class:`OwnerUnavailable`), marked retrieved: nobody may be
    waiting for it."""
    if not isinstance(exc, IstosError):
        exc = OwnerUnavailable(f"the chord callback's firing was interrupted ({exc!r})")
    outcome.set_exception(exc)
    outcome.exception()


class ChordBarriers:
    """The chord barriers of one queue owner (installed as its ack hook)."""

    def __init__(self, owner: OwnerHandle, app: Workflows) -> None:
        self.owner = owner
        self.app = app
        self.ns = f"wf:{owner.name}"
        self.cache: dict[str, Barrier] = {}
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._firing: dict[str, _Firing] = {}  # chord id -> its callback enqueue in flight
        self.stalled: set[str] = set()  # chords listing a dead member (watched for revivals)
        self._tasks: set[asyncio.Task[None]] = set()
        self._tombstones: deque[tuple[float, str]] = deque()
        self.callbacks = CallbackReservations(owner)
        self.asker = ExpectsAsker(self._ask_expects, owner.node.clock.monotonic)

    async def _ask_expects(self, callback: str, chord_id: str) -> dict[str, Any]:
        return await self.app.client(callback).call("chord_expects", chord_id=chord_id)

    async def on_ack(self, rec: JobRecord, result: bytes | None) -> None:
        """Record a chord member's result before its ack; fire the callback when complete.

        Decided under the chord's lock (the result stored first, write then apply), sent with
        no lock held: the member whose ack completes the barrier enqueues the callback, then
        stores the tombstone under the lock again. While that enqueue is in flight, an ack of
        the same member (a repeat, or a redelivery) waits for its outcome, and an ack of
        another member whose result is stored already returns at once: the sender's ack fails
        if the enqueue fails, so the sender is redelivered and fires again; should it run out
        of attempts (or be cancelled) first, the owner fires the complete barrier itself once
        the member has ended (:meth:`_fire_if_complete`). Raises what the enqueue or a storage
        write raises (the ack is refused and the member redelivered)."""
        meta = (rec.meta or {}).get("chord")
        if meta is None or rec.lease_token is None:
            return
        # Only an ack the state will accept counts (not, say, one for a job that went dead).
        if self.owner.state.holder(rec.job_id, rec.lease_token) is None:
            return
        chord_id = str(meta["id"])
        results = await self._record(chord_id, int(meta["index"]), int(meta["size"]), result)
        if results is None:
            return  # the barrier waits for more members, or fired already
        # (No await from the lock's release to here: a check of the firings and a registration
        # in one step, and from the registration on, its outcome is always set.)
        firing = self._firing.get(chord_id)
        if firing is not None:
            if firing.job_id == rec.job_id:
                await asyncio.shield(firing.outcome)  # raises what the sender's firing raised
            return  # another member's: the sender's ack answers for the callback (see above)
        await self._fire_once(chord_id, rec, meta, results)

    async def _fire_once(self, chord_id: str, rec: JobRecord, meta: dict[str, Any],
                         results: list[bytes]) -> None:
        """Fire ``chord_id``'s callback for member ``rec`` (the one whose ack, or end, sends
        it), registered as the chord's firing in flight until it ends. The caller checked,
        with no await since, that no firing is in flight. Raises what :meth:`_fire` raises."""
        firing = _Firing(rec.job_id, asyncio.get_running_loop().create_future())
        self._firing[chord_id] = firing
        try:
            await self._fire(chord_id, results, meta, rec.priority,
                             (rec.meta or {}).get("trace"))
        except BaseException as exc:
            _settle(firing.outcome, exc)
            raise
        else:
            firing.outcome.set_result(None)
        finally:
            self._firing.pop(chord_id, None)

    async def _fire_if_complete(self, job_id: str) -> None:
        """Fire the callback of member ``job_id``'s chord if its barrier holds every result
        and never fired: the member whose ack completed it had that ack refused (the
        callback's enqueue failed) and then ran out of attempts or was cancelled, or a crash
        came between. Every result is stored, so the owner fires it; the callback's fixed id
        and the tombstone keep it to once. Raises what the enqueue or a write raises."""
        rec = self.owner.state.jobs.get(job_id)
        meta = (rec.meta or {}).get("chord") if rec is not None else None
        if rec is None or not isinstance(meta, dict):
            return
        chord_id = str(meta["id"])
        while True:
            async with self._lock(chord_id):
                barrier = await self._find(chord_id)
                if barrier is None or barrier.fired or len(barrier.results) < barrier.size:
                    return
                results = [barrier.results[i] for i in range(barrier.size)]
            firing = self._firing.get(chord_id)
            if firing is None:
                break
            # A member's ack is firing it now: if that fails, its member (this one, ended)
            # is not redelivered to fire again, so look again once it ended.
            with contextlib.suppress(IstosError):
                await asyncio.shield(firing.outcome)
        log.warning("chord %s on queue %s: every result is in but the callback never went "
                    "out (member %s ended %s); firing it now", chord_id, self.owner.name,
                    job_id, rec.state)
        await self._fire_once(chord_id, rec, meta, results)

    async def _record(self, chord_id: str, index: int, size: int,
                      result: bytes | None) -> list[bytes] | None:
        """Store member ``index``'s result in its chord's barrier (write, then apply) under
        the chord's lock; return every result in member order once the barrier is complete
        and not fired, else None. Raises what the write raises."""
        async with self._lock(chord_id):
            barrier = await self._load(chord_id, size)
            if barrier.fired:
                return None
            if index not in barrier.results:
                value = result if result is not None else _NIL
                # Write, then apply: memory never runs ahead of storage. (A member listed
                # dead that succeeds now, revived, stalls the chord no more.)
                dead = {i: t for i, t in barrier.dead.items() if i != index}
                await self._store(chord_id, replace(
                    barrier, results={**barrier.results, index: value}, dead=dead))
                barrier.results[index], barrier.dead = value, dead
            if len(barrier.results) < barrier.size:
                return None
            return [barrier.results[i] for i in range(barrier.size)]

    async def _fire(self, chord_id: str, results: list[bytes], meta: dict[str, Any],
                    priority: int, trace: dict[str, str] | None = None) -> None:
        """Enqueue the callback (no lock held: a network wait), then store the tombstone under
        the chord's lock; ``trace``: the last member's trace context, which the callback
        continues (``istos.tracing``). Raises what the enqueue or the write raises."""
        # Results (and the input) encoded by payload codecs are composed as they are: this
        # owner may hold no codecs, the callback's worker decodes each part (payload.py).
        body: Any = compose(results, meta.get("input")) or {
            "results": [codec.decode_body(r) for r in results], "input": meta.get("input")}
        try:
            cb_meta = callback_meta(chord_id, self.owner.name, len(results), meta["key"])
            if trace:
                cb_meta["trace"] = trace
            # Idempotent by its id: a firing repeated (after a failed tombstone write, or a
            # crash) is dropped by the callback queue while the callback job is held.
            await self.app.enqueue(str(meta["callback"]), body, priority=priority,
                                   job_id=f"{chord_id}.callback", _meta=cb_meta)
        except IstosError as exc:
            # The member's ack fails with this error; its redelivery retries the firing.
            log.error("chord %s on queue %s: callback enqueue on %s failed: %s",
                      chord_id, self.owner.name, meta["callback"], exc)
            raise
        now = self.owner.node.clock.now()
        async with self._lock(chord_id):
            barrier = await self._load(chord_id, len(results))
            if barrier.fired:
                return
            tombstone = Barrier(barrier.size, fired=True, fired_at=now,
                                callback=barrier.callback)
            await self._store(chord_id, tombstone)  # write, then apply
            barrier.fired, barrier.fired_at, barrier.results = True, now, {}
            self.cache.pop(chord_id, None)  # a redelivered member (rare) reloads the tombstone
            self._tombstones.append((now, chord_id))
        await self._prune(now)

    # -- stalls: a member dead-lettered or cancelled while its chord waits -------------------
    def on_event(self, event: JobEvent) -> None:
        """Events of this owner's queue (:meth:`Workflows._route`): a dead-lettered or
        cancelled member is recorded as stalling its chord, a re-enqueued one (revived) no
        more; at start, the stalls are brought up to date with the jobs (a crash may have
        come in between)."""
        if event.kind == ev.OWNER_UP:
            self._spawn("recovering chord stalls", self._recover_stalls)
            return
        if event.kind == ev.ENQUEUED and event.job_id.rpartition(".")[0] not in self.stalled:
            return  # only a stalled chord's member is looked at
        rec = self.owner.state.jobs.get(event.job_id)
        chord = (rec.meta or {}).get("chord") if rec is not None else None
        if not isinstance(chord, dict):
            return
        if event.kind in (ev.DEAD_LETTERED, ev.CANCELLED):
            ended = DEAD if event.kind == ev.DEAD_LETTERED else CANCELLED
            self._spawn(f"recording {event.job_id} {ended}",
                        lambda: self._member_ended(event.job_id, chord, ended))
        else:
            self._spawn(f"recording {event.job_id} revived",
                        lambda: self._clear_dead(event.job_id, chord))

    async def revived(self, job_id: str) -> None:
        """``job_id`` was revived: if it stalled its chord, it does so no more (stored before
        the ``requeue_dead`` reply; a failed write is retried from the job's event)."""
        rec = self.owner.state.jobs.get(job_id)
        chord = (rec.meta or {}).get("chord") if rec is not None else None
        if isinstance(chord, dict):
            try:
                await self._clear_dead(job_id, chord)
            except IstosError as exc:
                log.warning("chord %s: recording %s revived deferred: %s", chord.get("id"),
                            job_id, exc)

    async def _member_ended(self, job_id: str, chord: dict[str, Any], ended: str) -> None:
        """Member ``job_id`` ended ``dead`` or ``cancelled``: record it as stalling its chord
        (:meth:`_note_stall`), then fire the chord if its barrier is complete
        (:meth:`_fire_if_complete`). Both are idempotent; raises what they raise."""
        await self._note_stall(job_id, chord, ended)
        await self._fire_if_complete(job_id)

    async def _note_stall(self, job_id: str, chord: dict[str, Any], ended: str) -> None:
        """Record member ``job_id``, ended ``dead`` or ``cancelled``, in its chord's barrier
        (the map of that name) once, through the write path; then emit a ``chord`` event
        (``stalled``) and log a warning. A dead member stalls the chord until revived; a
        cancelled one for good (a cancelled job never runs again: the record makes that
        visible instead of a chord that waits in silence). Raises what the write raises."""
        chord_id, index = str(chord["id"]), int(chord["index"])
        listing = "dead" if ended == DEAD else "cancelled"  # the Barrier field it goes in
        async with self._lock(chord_id):
            barrier = await self._find(chord_id)
            rec = self.owner.state.jobs.get(job_id)
            if barrier is None:
                return
            listed: dict[int, float] = getattr(barrier, listing)
            if barrier.fired or index in barrier.results or index in listed or rec is None \
                    or rec.state != ended:
                return  # not stalling it (or recorded already, or revived meanwhile)
            now_listed = {**listed, index: self.owner.node.clock.now()}
            await self._store(chord_id, replace(barrier, dead=now_listed) if ended == DEAD
                              else replace(barrier, cancelled=now_listed))
            setattr(barrier, listing, now_listed)  # (write, then apply)
            self.cache[chord_id] = barrier
            self.stalled.add(chord_id)
            if ended == DEAD:
                self.app.watch_revivals()
        if ended == DEAD:
            log.warning("chord %s on queue %s is stalled: member %d (%s) is dead; revive it "
                        "to resume the chord", chord_id, self.owner.name, index, job_id)
        else:
            log.warning("chord %s on queue %s is stalled for good: member %d (%s) was "
                        "cancelled, so its callback will not fire", chord_id, self.owner.name,
                        index, job_id)
        self._stall_event(job_id, chord_id, "stalled", index, barrier)

    async def _clear_dead(self, job_id: str, chord: dict[str, Any]) -> None:
        """Member ``job_id`` is held and no longer dead (revived): its chord no longer lists it
        as stalling it (through the write path); then emit a ``chord`` event (``resumed``).
        A member no longer held (its dead letter purged) stays listed: nothing can resume the
        chord, and ``why`` says so."""
        chord_id, index = str(chord["id"]), int(chord["index"])
        async with self._lock(chord_id):
            barrier = await self._find(chord_id)
            rec = self.owner.state.jobs.get(job_id)
            if barrier is None or index not in barrier.dead or rec is None \
                    or rec.state == DEAD:
                return
            dead = {i: t for i, t in barrier.dead.items() if i != index}
            await self._store(chord_id, replace(barrier, dead=dead))  # write, then apply
            barrier.dead = dead
            if not barrier.fired:
                self.cache[chord_id] = barrier
            if not dead and not barrier.cancelled:
                self.stalled.discard(chord_id)
        self._stall_event(job_id, chord_id, "resumed", index, barrier)

    async def _recover_stalls(self) -> None:
        """At start: the stalls stored (their chords watched for revivals), every member
        listed that is held and not dead any more (revived just before a crash) cleared, and
        every dead or cancelled member of a chord not fired recorded, and its chord fired if
        complete (its end may have been stored just before a crash). Chords with no barrier,
        or a fired one, have nothing to recover: their members' records are not looked at."""
        listed: list[tuple[str, int]] = []
        waiting: set[str] = set()  # chords whose barrier has not fired
        for key, raw in await self.owner.storage.scan(self.ns):
            if key.startswith("cb:"):
                continue  # a callback reservation (chord_callbacks.py), not a barrier
            barrier = Barrier.decode(raw)
            if barrier.fired:
                continue
            waiting.add(key)
            if barrier.dead or barrier.cancelled:
                self.stalled.add(key)
            if barrier.dead:
                self.app.watch_revivals()
                listed.extend((key, index) for index in barrier.dead)
        for chord_id, index in listed:
            job_id = f"{chord_id}.{index}"
            await self._clear_dead(job_id, {"id": chord_id, "index": index})
        if not waiting:
            return
        ended = [*self.owner.state.dead.values(),
                 *(r for r in self.owner.state.jobs.values() if r.state == CANCELLED)]
        for rec in ended:
            chord = (rec.meta or {}).get("chord")
            if isinstance(chord, dict) and str(chord.get("id")) in waiting:
                self._spawn(f"recording {rec.job_id} {rec.state}", functools.partial(
                    self._member_ended, rec.job_id, chord, rec.state))

    def _stall_event(self, job_id: str, chord_id: str, change: str, index: int,
                     barrier: Barrier) -> None:
        """A ``chord`` event naming member ``job_id``: ``change`` (``stalled``: it is dead or
        cancelled and the chord waits for it; ``resumed``: it no longer stalls the chord), with the
        chord's id, the member's index, the chord's size and the members stalling it now."""
        detail = dict(zip(protocol.CHORD_EVENT,
                          (chord_id, change, index, barrier.size, barrier.stalled_by()),
                          strict=True))
        self.owner.node.events.emit(JobEvent(
            self.owner.node.clock.now(), self.owner.node.node_id, self.owner.name, job_id,
            ev.CHORD, 0, None, detail))

    def _spawn(self, what: str, step: Callable[[], Awaitable[None]]) -> None:
        """Run ``step`` in the background until it succeeds, retried with backoff while the
        owner runs (a storage write that failed)."""
        async def run() -> None:
            delay = RETRY_MIN_S
            while self.owner.running:
                try:
                    await step()
                    return
                except IstosError as exc:
                    log.warning("queue %s: %s failed (retried): %s", self.owner.name, what, exc)
                await self.owner.node.clock.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def on_stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def op_open(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The ``chord_open`` op: hold a barrier for a chord about to enqueue its members."""
        chord_id, size, callback = msg["chord_id"], msg["size"], msg["callback"]
        try:
            check_queue_name(callback)
        except ConfigError as exc:
            raise InvalidJob(f"chord_open: callback {exc}") from None
        key = wf.check_key(chord_id, msg["key"])
        if chord_id != wf.chord_id(key, self.owner.name, size, callback):
            # The callback queue is fixed by the id: an opener cannot re-aim a chord it read.
            raise InvalidJob(f"chord_open: {chord_id!r} is not the id of a chord with that key, "
                             f"size and callback on queue {self.owner.name!r}")
        # No confused deputy: the callback queue must expect this chord (its opener reserved
        # it there, on that queue's produce key) before this owner agrees to fire into it.
        if not await self.asker.expects(callback, chord_id):
            raise InvalidJob(f"chord_open: queue {callback!r} holds no reservation for chord "
                             f"{chord_id!r}'s callback (app.chord sends chord_reserve there "
                             "first)")
        async with self._lock(chord_id):
            held = await self._find(chord_id)
            if held is not None:
                if held.size != size or held.callback not in (None, callback):
                    raise InvalidJob(f"chord {chord_id!r} is already open with another size "
                                     "or callback")
                return {"opened": False}
            barrier = Barrier(size, callback=callback)
            await self._store(chord_id, barrier)
            self.cache[chord_id] = barrier
        return {"opened": True}

    async def check_meta(self, job_id: str, meta: dict[str, Any] | None) -> None:
        """Refuse (:class:`InvalidJob`) a ``meta`` the workflow code would not have written:
        another shape, a job id that does not match it or its key, a reserved id without
        meta, a chord barrier this owner does not hold, or a callback it did not reserve (a
        producer must not make an owner enqueue callbacks it chose). A chord member may
        carry a ``batch`` entry beside its chord (a chord with ends), proven as a batch
        member's."""
        if meta is not None and "chord" in meta and "batch" in meta:
            bs.check_member_meta(self.owner.name, job_id, meta["batch"])
            meta = {k: v for k, v in meta.items() if k != "batch"}
        chord = check_workflow_meta(self.owner.name, job_id, meta)
        if chord is None:
            return  # a chain step
        if meta is not None and "callback" in meta:
            await self.callbacks.check(job_id, chord)
            return
        size = chord["size"]
        held = await self._find(chord["id"])
        if held is None or held.size != size or held.callback not in (None, chord["callback"]):
            raise InvalidJob(f"job {job_id!r}: queue {self.owner.name!r} holds no open chord "
                             f"{chord['id']!r} of that size and callback (use app.chord)")

    async def _find(self, chord_id: str) -> Barrier | None:
        barrier = self.cache.get(chord_id)
        if barrier is None:
            raw = await self.owner.node.storage.get(self.ns, chord_id)
            barrier = Barrier.decode(raw) if raw is not None else None
        return barrier

    async def _load(self, chord_id: str, size: int) -> Barrier:
        barrier = self.cache.get(chord_id)
        if barrier is None:
            raw = await self.owner.storage.get(self.ns, chord_id)
            barrier = Barrier.decode(raw) if raw is not None else Barrier(size)
            if not barrier.fired:
                self.cache[chord_id] = barrier
        return barrier

    async def _store(self, chord_id: str, barrier: Barrier) -> None:
        await self.owner.writes.put_aux(self.ns, chord_id, barrier.encode())

    async def _prune(self, now: float) -> None:
        while self._tombstones and now - self._tombstones[0][0] >= TOMBSTONE_TTL_S:
            _, chord_id = self._tombstones.popleft()
            await self.owner.writes.delete_aux(self.ns, chord_id)

    @asynccontextmanager
    async def _lock(self, chord_id: str) -> AsyncIterator[None]:
        """A per-chord lock, dropped when nobody holds or awaits it (no growth per chord)."""
        lock, users = self._locks.get(chord_id, (asyncio.Lock(), 0))
        self._locks[chord_id] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[chord_id]
            if users <= 1:
                del self._locks[chord_id]
            else:
                self._locks[chord_id] = (lock, users - 1)

