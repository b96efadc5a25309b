"""Batches on a queue owner: the home side (barrier, callbacks) and the member side (reports).

Every owner of an app plays both parts (``core/batch_state.py`` has the rules):

**Home.** A batch lives at the owner of its home queue, in that owner's storage: namespace
``batch:{home}:{batch id}`` holds the header (``h``: counts, closed, callbacks fired) and one
key per member (``m:{member job id}``: its last outcome). Adding a member and counting its end
each write the member's key and the header in ONE atomic ``apply`` (through the owner's
storage, fenced for an HA leader), then change memory: a restart or failover reloads exactly
what was counted, and a repeated report finds the member's outcome already stored. Namespace
``batches:{home}`` lists the home's batches (for ``batches``, recovery and pruning). Memory per
open batch is its header (a few hundred bytes), never its members.

**Callbacks.** When a change makes a callback due (``BatchHeader.due``), the home owner
records the decision to fire it (``BatchHeader.firing``, under the batch's lock), then, the
lock released (no lock is held across a network wait), enqueues it with the job id
``{batch id}.{kind}`` and a dedup window of :data:`TOMBSTONE_TTL_S` (a repeat of a firing
whose record was lost in a crash is dropped by the callback queue), then records it fired
under the lock again. A callback queue other than the home accepts it only
when the batch's creator reserved it there (``batch_reserve``, on that queue's ``produce`` key:
an owner never fires into a queue its creator could not enqueue on). A firing that fails (the
callback queue's owner unreachable) is retried in the background with backoff, and due
callbacks are fired again when the home owner starts.

**Members.** A member carries ``meta={"batch": {id, home, key}}``. Its owner reports its end to
the home: ``done`` before the ack is applied (an ack hook: the ack fails, and the job is
redelivered, while the home does not answer), ``dead`` and ``cancelled`` once their change is
stored (from the owner's events), retried with backoff until the home answers, and again for
every dead or cancelled member a (re)started owner holds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import msgpack

from ... import codec
from ... import events as ev
from ...core import batch_state as bs
from ...core.records import JobRecord
from ...errors import CapacityExceeded, InvalidJob, IstosError, JobNotFound
from ...events import JobEvent
from ..extension import Handler, OwnerExtension
from .reports import RETRY_MAX_S, RETRY_MIN_S, ReportQueue  # (firings back off as reports do)

if TYPE_CHECKING:
    from ..handle import OwnerHandle

log = logging.getLogger("istos.batch")

TOMBSTONE_TTL_S = 86_400.0
"""How long (home clock) a finished batch is kept (status, late reports) before it is pruned;
also the dedup window of its callbacks."""
MAX_LISTED = 1000  # batches one ``batches`` reply lists
MAX_BATCHES = 100_000  # batches one home holds (open, or finished and not pruned yet)
PRUNE_PER_START = 256  # finished batches pruned per owner start or batch_open (bounded)

Call = Callable[..., Awaitable[dict[str, Any]]]  # (queue, op, **fields) -> reply
Fire = Callable[..., Awaitable[str]]  # the producer's enqueue(queue, data, job_id=, ...)


class BatchOwner(OwnerExtension):
    """One owner's batches extension (see the module doc)."""

    name = "batches"
    serves = ("batch_open", "batch_add", "batch_close", "batch_report", "batch_status",
              "batches", "batch_reserve", "batch_members")
    wraps = ("enqueue",)
    meta_only_wraps = ("enqueue",)  # a request without batch meta goes straight through
    before_ack_meta_only = True

    def __init__(self, owner: OwnerHandle, call: Call, fire: Fire) -> None:
        self.owner = owner
        self._call, self._fire = call, fire
        self.index_ns = f"batches:{owner.name}"
        self.cb_ns = f"batchcb:{owner.name}"
        self.open: dict[str, bs.BatchHeader] = {}  # batch id -> header, cached
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}
        self._refiring: set[str] = set()
        self._sending: set[str] = set()  # batches whose decided callbacks a task is sending
        # A dead or cancelled member's end, by job id: (its batch entry, its outcome).
        self._reports: ReportQueue[str, tuple[dict[str, Any], str]] = ReportQueue(
            owner, self._send_report, self._report_deferred)
        self._tasks: set[asyncio.Task[None]] = set()
        # Finished batches by when they finished (a heap, each batch once): pruning looks at
        # the oldest only, so a batch_open costs O(pruned * log n), not O(batches held).
        self._finished: list[tuple[float, str]] = []
        self._heaped: set[str] = set()

    def _ns(self, bid: str) -> str:
        return f"batch:{self.owner.name}:{bid}"

    def ops(self) -> dict[str, Handler]:
        return {"batch_open": self.op_open, "batch_add": self.op_add,
                "batch_close": self.op_close, "batch_report": self.op_report,
                "batch_status": self.op_status, "batches": self.op_list,
                "batch_reserve": self.op_reserve, "batch_members": self.op_members}

    # -- enqueue of members and callbacks -----------------------------------------------------
    def wrap(self, op: str, inner: Handler) -> Handler:
        async def enqueue(msg: dict[str, Any]) -> dict[str, Any]:
            meta = msg.get("meta")
            if not isinstance(meta, dict) or not meta.keys() & {"batch", "batch_cb"} \
                    or "chord" in meta:
                # (A chord member with ends carries its batch beside its chord: the workflow
                # code's meta check proves both, in the plain enqueue.)
                return await inner(msg)
            job_id = msg.get("job_id") or self.owner.node.ids.new()
            if len(meta) != 1:
                raise InvalidJob(f"job {job_id!r}: batch meta comes alone")
            if not self.owner.state.holds(job_id, self.owner.node.clock.now()):
                if "batch" in meta:
                    bs.check_member_meta(self.owner.name, job_id, meta["batch"])
                else:
                    await self._check_callback(job_id, meta["batch_cb"])
            created = await self.owner.enqueue(
                msg["body"], job_id=job_id, delay_s=float(msg.get("delay_s", 0.0)),
                priority=msg.get("priority", 0), meta=meta, dedup_s=msg.get("dedup_s"),
                group=msg.get("group"))
            if created and "batch_cb" in meta and meta["batch_cb"]["home"] != self.owner.name:
                # Used: a repeat finds the job, or its dedup window, instead.
                await self.owner.writes.delete_aux(self.cb_ns, job_id)
            return {"job_id": job_id, "created": created}
        return enqueue

    async def _check_callback(self, job_id: str, entry: Any) -> None:
        cb = bs.check_callback_meta(self.owner.name, job_id, entry)
        if cb["home"] == self.owner.name:
            return  # its creator opened it on this queue's produce key
        if await self.owner.storage.get(self.cb_ns, job_id) is None:
            raise InvalidJob(f"job {job_id!r}: queue {self.owner.name!r} holds no reservation "
                             "for this batch callback (app.batch makes one)")

    async def op_reserve(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``batch_reserve``: expect callbacks ``kinds`` of batch ``batch_id`` on this queue."""
        bid, kinds = msg["batch_id"], msg["kinds"]
        bs.check_proof("batch_reserve", bid, msg["key"], bs.home_of(bid))
        if any(k not in bs.KINDS for k in kinds):
            raise InvalidJob(f"batch_reserve: kinds are among {bs.KINDS}")
        stamp = msgpack.packb({"made_at": self.owner.node.clock.now()})
        await self.owner.writes.apply_aux(
            self.cb_ns, [(bs.callback_job_id(bid, k), stamp) for k in kinds], [])
        return {"reserved": True}

    # -- the home side -------------------------------------------------------------------------
    async def op_open(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``batch_open``: hold batch ``batch_id`` here, with its callbacks."""
        bid = msg["batch_id"]
        bs.check_proof("batch_open", bid, msg["key"], self.owner.name)
        callbacks: dict[str, tuple[str, bytes]] = {}
        for kind, spec in msg["callbacks"].items():
            if kind not in bs.KINDS or not isinstance(spec, list) or len(spec) != 2:
                raise InvalidJob(f"batch_open: callbacks map a kind of {bs.KINDS} to "
                                 "[queue, input]")
            bs._queue(bid, spec[0])
            if not isinstance(spec[1], bytes):
                raise InvalidJob(f"batch_open: callbacks.{kind} input must be bytes")
            callbacks[kind] = (spec[0], spec[1])
        parent = msg.get("parent_batch")
        if parent is not None:
            parent = bs.check_parent(parent)
        await self._load_all()
        await self._prune()
        async with self._lock(bid):
            if await self._load(bid) is not None:
                return {"opened": False}
            if len(self.open) >= MAX_BATCHES:
                raise CapacityExceeded(
                    f"batch_open: queue {self.owner.name!r} is home to {len(self.open)} "
                    "batches (open, or finished less than a day ago), the most it may")
            now = self.owner.node.clock.now()
            header = bs.BatchHeader(callbacks, description=msg.get("description") or "",
                                    created_at=now, parent=parent)
            await self.owner.writes.put_aux(self.index_ns, bid, msgpack.packb({"at": now}))
            # The key stays with the header: callbacks due after a restart need it.
            await self.owner.writes.apply_aux(self._ns(bid), [
                ("h", self._pack(header)), ("k", msgpack.packb(msg["key"]))], [])
            self._remember(bid, header)
        self._event(bid, "opened", header)
        return {"opened": True}

    async def op_add(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``batch_add``: count member ``member`` (a job id on ``member_queue``) as pending. After
        close only a pending member of the batch (``parent``) may add (work that finds work)."""
        bid, member, parent = msg["batch_id"], msg["member"], msg.get("parent")
        bs.check_proof("batch_add", bid, msg["key"], self.owner.name)
        bs._queue(member, msg["member_queue"])
        ns = self._ns(bid)
        async with self._lock(bid):
            header = await self._require(bid)
            if header.closed and (header.pending == 0 or parent is None or
                                  await self._outcome(ns, parent) != bs.PENDING):
                raise InvalidJob(f"batch {bid!r} is closed: only a pending member may add to "
                                 "it (ctx.batch.add)") if header.pending else \
                    InvalidJob(f"batch {bid!r} is closed and finished: nothing can join it")
            if await self._outcome(ns, member) is not None:
                return {"added": False}
            new = _copy(header)
            new.apply(None, bs.PENDING)
            await self.owner.writes.apply_aux(ns, [
                ("h", self._pack(new)),
                (f"m:{member}", msgpack.packb({"o": bs.PENDING, "q": msg["member_queue"]}))], [])
            self._remember(bid, new)
        return {"added": True}

    async def op_close(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``batch_close``: no member joins from outside any more; fire what is due."""
        bid = msg["batch_id"]
        bs.check_proof("batch_close", bid, msg["key"], self.owner.name)
        async with self._lock(bid):
            header = await self._require(bid)
            if not header.closed:
                new = _copy(header)
                new.closed = True
                if new.pending == 0:  # (an empty batch, or every member ended already)
                    new.finished_at = self.owner.node.clock.now()
                await self.owner.writes.put_aux(self._ns(bid), "h", self._pack(new))
                header = self._remember(bid, new)
                self._event(bid, "closed", header)
                if header.finished_at is not None:
                    self._event(bid, "finished", header)
        await self._fire_due(bid, msg["key"])
        await self._tell_parent(bid)
        return {"closed": True}

    async def op_report(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``batch_report``: member ``member`` ended with ``outcome``; idempotent by member."""
        bid, member, outcome = msg["batch_id"], msg["member"], msg["outcome"]
        bs.check_proof("batch_report", bid, msg["key"], self.owner.name)
        ns = self._ns(bid)
        async with self._lock(bid):
            header = await self._load(bid)
            if header is None:
                return {"status": "unknown"}  # pruned long after it finished, or never opened
            raw = await self.owner.storage.get(ns, f"m:{member}")
            if raw is None:
                return {"status": "unknown"}
            entry = msgpack.unpackb(raw)
            new = _copy(header)
            if not new.apply(entry["o"], outcome):
                status = "repeat"
                if entry["o"] == bs.DONE and outcome != bs.DONE:
                    # done is final (its handler succeeded): say why the later end is ignored
                    self._event(bid, "kept_done", header, member=member, reported=outcome)
            else:
                finishing = new.closed and new.pending == 0 and new.finished_at is None
                if finishing:
                    new.finished_at = self.owner.node.clock.now()
                await self.owner.writes.apply_aux(ns, [
                    ("h", self._pack(new)),
                    (f"m:{member}", msgpack.packb({**entry, "o": outcome}))], [])
                header = self._remember(bid, new)
                status = "counted"
                if finishing:
                    self._event(bid, "finished", header)
        await self._fire_due(bid, msg["key"])
        await self._tell_parent(bid)
        return {"status": status}

    async def op_status(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``batch_status`` (read): the batch's counts and callbacks; never its key."""
        bid = msg["batch_id"]
        header = await self._load(bid)
        return {"batch": None if header is None else header.status(bid, self.owner.name)}

    async def op_list(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``batches`` (read): this home's batches, unfinished first, then newest first."""
        await self._load_all()
        limit = min(int(msg.get("limit") or MAX_LISTED), MAX_LISTED)
        rows = sorted(self.open.items(), key=lambda kv: (kv[1].finished_at is not None,
                                                          -kv[1].created_at))
        return {"batches": [h.status(bid, self.owner.name) for bid, h in rows[:limit]],
                "total": len(rows),
                "open": sum(1 for _, h in rows if h.finished_at is None)}

    async def op_members(self, msg: dict[str, Any]) -> dict[str, Any]:
        """``batch_members`` (read): up to ``limit`` members (job id, queue, outcome), those
        in state ``state`` only if given."""
        bid, want = msg["batch_id"], msg.get("state")
        limit = min(int(msg.get("limit") or MAX_LISTED), MAX_LISTED)
        if await self._load(bid) is None:
            raise JobNotFound(f"queue {self.owner.name!r} holds no batch {bid!r}")
        rows = []
        for key, raw in await self.owner.storage.scan(self._ns(bid)):
            if key.startswith("m:"):  # (never "k", the key)
                entry = msgpack.unpackb(raw)
                if want is None or entry["o"] == want:
                    rows.append({"job_id": key[2:], "queue": entry["q"], "state": entry["o"]})
        rows.sort(key=lambda r: r["job_id"])
        return {"members": rows[:limit], "more": len(rows) > limit}

    async def _fire_due(self, bid: str, key: str) -> None:
        """Fire the batch's due callbacks; never holds the batch's lock across the network.

        Under the lock, each newly due callback is decided: stored in the header's ``firing``
        (with the counts it carries) through the write path. Then, lock released, each decided
        callback is enqueued with its deterministic job id (a repeat is dropped by the callback
        queue), and recorded fired under the lock again. A crash in between leaves the decision
        stored, and the restart sends it again. One task per batch sends (``_sending``); others
        only decide, and the sender picks their decisions up. A failed enqueue is retried in the
        background; a failed storage write raises (and is retried in the background too)."""
        async with self._lock(bid):
            header = await self._load(bid)
            if header is None:
                return
            due = header.due()
            if due:
                new = _copy(header)
                for kind in due:
                    new.firing[kind] = header.counts()
                await self.owner.writes.put_aux(self._ns(bid), "h", self._pack(new))
                header = self._remember(bid, new)
            if bid in self._sending or not header.to_send():
                return
            self._sending.add(bid)
        try:
            await self._send_decided(bid, key)
        except BaseException as exc:
            self._sending.discard(bid)
            if isinstance(exc, IstosError):
                self._refire_later(bid, key)
            raise

    async def _send_decided(self, bid: str, key: str) -> None:
        """Send the decided callbacks until none is left or one fails (then retried in the
        background). The caller holds ``_sending``; this gives it back on return."""
        while True:
            async with self._lock(bid):
                header = await self._load(bid)
                kinds = [] if header is None else header.to_send()
                if header is None or not kinds:
                    self._sending.discard(bid)  # under the lock: a decision after this sends
                    return
            kind = kinds[0]
            queue, raw_input = header.callbacks[kind]
            body = {"batch_id": bid, "kind": kind, "description": header.description,
                    **header.firing[kind], "input": codec.decode_body(raw_input)}
            try:
                await self._fire(queue, body, job_id=bs.callback_job_id(bid, kind),
                                 dedup_s=TOMBSTONE_TTL_S,
                                 _meta={"batch_cb": {"id": bid, "home": self.owner.name,
                                                     "kind": kind, "key": key}})
            except IstosError as exc:
                log.warning("batch %s: callback %s on queue %s not enqueued (retried): %s",
                            bid, kind, queue, exc)
                self._sending.discard(bid)
                self._refire_later(bid, key)
                return
            async with self._lock(bid):
                header = await self._load(bid)
                if header is None or kind in header.fired:
                    continue  # recorded by another sender (a repeat went out, dropped by id)
                new = _copy(header)
                new.fired[kind] = self.owner.node.clock.now()
                new.firing.pop(kind, None)
                await self.owner.writes.put_aux(self._ns(bid), "h", self._pack(new))
                header = self._remember(bid, new)
            self._event(bid, "fired", header, callback=kind, callback_queue=queue)
            log.info("batch %s: callback %s enqueued on queue %s", bid, kind, queue)

    async def _tell_parent(self, bid: str) -> None:
        """A finished child batch reports its outcome to its parent's home, as a member's
        owner would (outside the batch's lock: a network wait); recorded once counted there.
        A failure is retried in the background with the firings."""
        header = self.open.get(bid)
        if header is None or not header.owes_parent():
            return
        parent, outcome = header.parent, header.outcome()
        assert parent is not None and outcome is not None
        try:
            await self._report(parent, bid, outcome)
        except IstosError as exc:
            log.warning("batch %s: report to parent batch %s deferred: %s", bid, parent["id"],
                        exc)
            key = await self._key_of(bid)
            if key is not None:
                self._refire_later(bid, key)
            return
        async with self._lock(bid):
            header = await self._load(bid)
            if header is not None and header.outcome() == outcome:
                new = _copy(header)
                new.parent_told = outcome
                await self.owner.writes.put_aux(self._ns(bid), "h", self._pack(new))
                self._remember(bid, new)

    def _refire_later(self, bid: str, key: str) -> None:
        if bid in self._refiring or not self.owner.running:
            return
        self._refiring.add(bid)

        async def refire() -> None:
            delay = RETRY_MIN_S
            try:
                while self.owner.running:
                    await self.owner.node.clock.sleep(delay)
                    delay = min(delay * 2, RETRY_MAX_S)
                    try:
                        header = await self._load(bid)
                        if header is None or not header.owes_work():
                            return
                        self._refiring.discard(bid)  # a failure below schedules anew
                        await self._fire_due(bid, key)
                        await self._tell_parent(bid)
                        return
                    except IstosError as exc:
                        log.warning("batch %s: firing again failed: %s", bid, exc)
            finally:
                self._refiring.discard(bid)
        self._spawn(refire())

    async def _recover(self) -> None:
        """On start: cache this home's batches, fire what is due, prune old finished ones."""
        await self._load_all(force=True)
        for bid, header in list(self.open.items()):
            if header.owes_work():
                key = await self._key_of(bid)
                if key is not None:
                    self._refire_later(bid, key)
        await self._prune()

    async def _prune(self) -> None:
        """Delete up to :data:`PRUNE_PER_START` batches finished over a day ago (storage
        first, then memory), oldest first; run at start and at each ``batch_open``. Looks at
        no more batches than it prunes (plus one), however many this home holds."""
        now, pruned = self.owner.node.clock.now(), 0
        while self._finished and pruned < PRUNE_PER_START:
            finished_at, bid = self._finished[0]
            if now - finished_at < TOMBSTONE_TTL_S:
                return
            heapq.heappop(self._finished)
            self._heaped.discard(bid)
            header = self.open.get(bid)
            if header is None:
                continue
            if header.owes_work():  # owed work first: look again later
                heapq.heappush(self._finished, (now, bid))
                self._heaped.add(bid)
                continue
            pruned += 1
            async with self._lock(bid):
                keys = [k for k, _ in await self.owner.storage.scan(self._ns(bid))]
                await self.owner.writes.apply_aux(self._ns(bid), [], keys)
                await self.owner.writes.delete_aux(self.index_ns, bid)
                self.open.pop(bid, None)

    def _event(self, bid: str, change: str, header: bs.BatchHeader, **extra: Any) -> None:
        """A ``batch`` event (once the change is stored): ``change`` is ``opened``,
        ``closed``, ``finished``, ``fired`` (``callback``, ``callback_queue``) or
        ``kept_done`` (``member``, ``reported``: a member counted done was reported dead or
        cancelled later, and stays done), with the batch id and its counts. It names no job
        (``job_id`` "")."""
        self.owner.node.events.emit(JobEvent(
            self.owner.node.clock.now(), self.owner.node.node_id, self.owner.name, "",
            ev.BATCH, 0, None, {"batch_id": bid, "change": change, **header.counts(),
                                **extra}))

    def _remember(self, bid: str, header: bs.BatchHeader) -> bs.BatchHeader:
        """Cache ``header`` (once stored); a finished batch joins the pruning heap once."""
        self.open[bid] = header
        if header.finished_at is not None and bid not in self._heaped:
            heapq.heappush(self._finished, (header.finished_at, bid))
            self._heaped.add(bid)
        return header

    async def _key_of(self, bid: str) -> str | None:
        raw = await self.owner.storage.get(self._ns(bid), "k")
        return None if raw is None else str(msgpack.unpackb(raw))

    # -- storage helpers -------------------------------------------------------------------------
    def _pack(self, header: bs.BatchHeader) -> bytes:
        return msgpack.packb(header.encode(), use_bin_type=True)  # type: ignore[no-any-return]

    async def _load(self, bid: str) -> bs.BatchHeader | None:
        header = self.open.get(bid)
        if header is None:
            raw = await self.owner.storage.get(self._ns(bid), "h")
            if raw is None:
                return None
            header = bs.BatchHeader.decode(msgpack.unpackb(raw, raw=False))
            self._remember(bid, header)
        return header

    async def _load_all(self, force: bool = False) -> None:
        if force or not getattr(self, "_listed", False):
            for bid, _ in await self.owner.storage.scan(self.index_ns):
                await self._load(bid)
            self._listed = True

    async def _require(self, bid: str) -> bs.BatchHeader:
        header = await self._load(bid)
        if header is None:
            raise InvalidJob(f"queue {self.owner.name!r} holds no batch {bid!r} (app.batch "
                             "opens one)")
        return header

    async def _outcome(self, ns: str, member: str) -> str | None:
        raw = await self.owner.storage.get(ns, f"m:{member}")
        return None if raw is None else str(msgpack.unpackb(raw)["o"])

    @asynccontextmanager
    async def _lock(self, bid: str) -> AsyncIterator[None]:
        """A per-batch lock, dropped when nobody holds or awaits it."""
        lock, users = self._locks.get(bid, (asyncio.Lock(), 0))
        self._locks[bid] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[bid]
            if users <= 1:
                del self._locks[bid]
            else:
                self._locks[bid] = (lock, users - 1)

    # -- the member side ---------------------------------------------------------------------------
    async def before_ack(self, rec: JobRecord, result: bytes | None) -> None:
        """A member's ``done`` reaches its home before its ack is applied."""
        entry = (rec.meta or {}).get("batch")
        if entry is None or rec.lease_token is None \
                or self.owner.state.holder(rec.job_id, rec.lease_token) is None:
            return
        await self._report(entry, rec.job_id, bs.DONE)

    async def _report(self, entry: dict[str, Any], member: str, outcome: str) -> None:
        await self._call(entry["home"], "batch_report", batch_id=entry["id"], key=entry["key"],
                         member=member, outcome=outcome)

    def on_event(self, event: JobEvent) -> None:
        """Events of this owner's queue (``features/batch.py`` routes them here)."""
        if event.kind == ev.OWNER_UP:
            for held in list(self.owner.state.jobs.values()):
                self._note_end(held)
            self._spawn(self._recover_quietly())
        elif event.kind in (ev.DEAD_LETTERED, ev.CANCELLED):
            rec = self.owner.state.jobs.get(event.job_id)
            if rec is not None:
                self._note_end(rec)

    async def _recover_quietly(self) -> None:
        try:
            await self._recover()
        except IstosError as exc:
            log.warning("queue %s: recovering batches failed: %s", self.owner.name, exc)

    def _note_end(self, rec: JobRecord) -> None:
        entry = (rec.meta or {}).get("batch")
        outcome = {"dead": bs.DEAD, "cancelled": bs.CANCELLED}.get(rec.state)
        if entry is None or outcome is None:
            return
        self._reports.note(rec.job_id, (entry, outcome))
        self._reports.start()

    async def _send_report(self, job_id: str, report: tuple[dict[str, Any], str]) -> None:
        entry, outcome = report
        await self._report(entry, job_id, outcome)

    def _report_deferred(self, job_id: str, report: tuple[dict[str, Any], str],
                         exc: IstosError) -> None:
        log.info("queue %s: batch report of %s deferred: %s", self.owner.name, job_id, exc)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def on_stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._reports.cancel()


def _copy(header: bs.BatchHeader) -> bs.BatchHeader:
    """A copy to change and write; memory takes it only once the write succeeded."""
    return dataclasses.replace(header, fired=dict(header.fired), firing=dict(header.firing))
