"""What an owner knows of the workers that serve its queue: the ``workers`` op (read role).

A worker is one runner on one node (its slot ids' prefix, ``node:function``). The owner learns
of it from the requests it sends (``claim``: its free slots and, from current workers, its
``wi`` = [slots, concurrency, prefetch (-1: automatic), heartbeat]; ``extend``; ``release``)
and counts what happened to its deliveries from the owner's own events (claimed, acked,
nacked, lease expired), so the counts are the owner's truth, not the worker's word. A worker
not seen for ``SEEN_LEASES`` lease periods (at least ``MIN_SEEN_S``) drops out of the table;
at most ``MAX_WORKERS`` are tracked. Names come from requests, so a full table makes room by
evicting the longest silent row *without* recent verified activity: a lease claimed, acked,
nacked or renewed with its token (the owner's own events) within the same horizon. A flood of
invented ids (empty claims) then only evicts other unverified rows, never a working worker's.

Everything in a row except the counts comes from the requests of a peer that holds the ``work``
role, which is trusted to claim anyway; the fields are checked for type and range only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ... import events as ev
from ... import protocol
from ...core.state import LEASED
from ...events import JobEvent
from ..extension import Handler, OwnerExtension, not_wrapped
from ..handle import OwnerHandle
from .slicing import Slicer

SEEN_LEASES = 3
MIN_SEEN_S = 60.0
MAX_WORKERS = 4096
MAX_WORKER_SLOTS = 1 << 20
MAX_HELD_SHOWN = 100  # job ids of one worker's held jobs in a row (held_count says how many)
_COUNTED = {ev.CLAIMED: "claimed", ev.ACKED: "acked", ev.NACKED: "nacked",
            ev.LEASE_EXPIRED: "expired"}
_VERIFIED = frozenset({ev.CLAIMED, ev.ACKED, ev.NACKED, ev.LEASE_EXTENDED})  # token-proven


@dataclass(slots=True)
class WorkerRow:
    """One worker (``node:function``) as the owner has seen it."""

    worker: str
    node: str
    first_seen: float
    last_seen: float
    slots: int | None = None
    concurrency: int | None = None
    prefetch: int | None = None  # None: unknown; -1: automatic
    heartbeat: bool | None = None
    verified: float | None = None  # when it last did something only a lease holder can
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("claimed", "acked", "nacked", "expired", "released"), 0))


def worker_of(slot_id: str) -> str:
    """The worker a slot id (``node:function#i``) belongs to."""
    return slot_id.rpartition("#")[0] or slot_id


class WorkerTracker(OwnerExtension):
    """Tracks the workers of one owner from the requests it wraps (``claim``, ``extend``:
    installed after the lease ops, ``release``)."""

    name = "workers"
    serves = ("workers",)
    wraps = ("claim", "extend", "release")

    def __init__(self, owner: OwnerHandle) -> None:
        self.owner = owner
        self.rows: dict[str, WorkerRow] = {}
        self._claim: Handler = not_wrapped
        self._extend: Handler = not_wrapped
        self._release: Handler = not_wrapped
        self._unsubscribe = owner.node.events.subscribe(self._on_event)

    def ops(self) -> Mapping[str, Handler]:
        return {"workers": self.op_workers}

    def wrap(self, op: str, inner: Handler) -> Handler:
        if op == "claim":
            self._claim = inner
            return self._op_claim
        if op == "extend":
            self._extend = inner
            return self._op_extend
        self._release = inner
        return self._op_release

    def on_stop(self) -> None:
        self._unsubscribe()

    # -- learning --
    def _horizon(self) -> float:
        return max(MIN_SEEN_S, SEEN_LEASES * self.owner.config.policy.lease_s)

    def _seen(self, worker: str, node: str | None = None, *,
              verified: bool = False) -> WorkerRow:
        """Mark ``worker`` seen now (``verified``: by the owner's own event of a lease it
        holds); its row moves to the end, so ``rows`` stays ordered by ``last_seen``."""
        now = self.owner.node.clock.now()
        row = self.rows.pop(worker, None)
        if row is None:
            row = WorkerRow(worker, node or worker.rpartition(":")[0] or worker, now, now)
            if len(self.rows) >= MAX_WORKERS and not self._make_room(now, verified):
                return row  # a full table of working workers: an unproven one is not kept
        row.last_seen = now
        if verified:
            row.verified = now
        self.rows[worker] = row
        return row

    def _make_room(self, now: float, verified: bool) -> bool:
        """Evict one row for a new one: the longest silent without recent verified activity
        (or, for a verified newcomer, the longest silent at all). False: nothing evicted."""
        self._prune(now)
        if len(self.rows) < MAX_WORKERS:
            return True
        horizon = self._horizon()
        for name, row in self.rows.items():  # longest silent first
            if row.verified is None or now - row.verified > horizon:
                del self.rows[name]
                return True
        if verified:
            del self.rows[next(iter(self.rows))]
            return True
        return False

    async def _op_claim(self, msg: dict[str, Any]) -> dict[str, Any]:
        slots = msg.get("workers")
        if isinstance(slots, list) and slots and isinstance(slots[0], str):
            row = self._seen(worker_of(slots[0]), msg.get("node") or None)
            _note_info(row, msg.get("wi"))
        return await self._claim(msg)

    async def _op_extend(self, msg: dict[str, Any]) -> dict[str, Any]:
        self._note_holders(msg.get("items"))
        return await self._extend(msg)

    async def _op_release(self, msg: dict[str, Any]) -> dict[str, Any]:
        holders = self._note_holders(msg.get("items"))
        reply = await self._release(msg)
        for holder, status in zip(holders, reply.get("statuses") or ()):
            if holder is not None and status == "ok":
                self._seen(holder).counts["released"] += 1
        return reply

    def _note_holders(self, items: object) -> list[str | None]:
        """The worker holding each item's job (None: not leased), each marked as seen."""
        if not isinstance(items, list):
            return []
        jobs, out = self.owner.state.jobs, []
        for item in items:
            rec = jobs.get(str(item.get("job_id"))) if isinstance(item, dict) else None
            holder = worker_of(rec.lease_worker) if rec is not None and rec.lease_worker \
                and rec.state == LEASED else None
            out.append(holder)
        for holder in set(out) - {None}:
            assert holder is not None
            self._seen(holder)
        return out

    def _on_event(self, event: JobEvent) -> None:
        if event.queue != self.owner.name or not event.worker:
            return
        if event.kind in _VERIFIED:  # only the lease's holder makes these happen
            row: WorkerRow | None = self._seen(worker_of(event.worker), verified=True)
        else:  # (a lease expiring says nothing of its worker: counted, never "seen")
            row = self.rows.get(worker_of(event.worker))
        name = _COUNTED.get(event.kind)
        if name is not None and row is not None:
            row.counts[name] += 1

    def _prune(self, now: float) -> None:
        """Drop rows silent past the horizon (the oldest first: ``rows`` is in seen order)."""
        horizon = self._horizon()
        while self.rows:
            name, row = next(iter(self.rows.items()))
            if now - row.last_seen <= horizon:
                return
            del self.rows[name]

    def seen_count(self) -> int:
        """How many workers were seen lately."""
        self._prune(self.owner.node.clock.now())
        return len(self.rows)

    # -- the op --
    async def op_workers(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Workers seen lately, longest known first, paged by count and bytes."""
        now = self.owner.node.clock.now()
        self._prune(now)
        offset = msg.get("offset", 0)
        limit = min(protocol.MAX_PAGE, msg.get("limit", protocol.MAX_PAGE))
        held: dict[str, list[str]] = {}
        # The leased records come from whichever is shorter: the lease heap (a few leases
        # out of a deep queue of waiting jobs cost a few entries, not a walk of 100k records)
        # or every record; a snapshot, walked in slices, each record checked as it is reached.
        state, slicer = self.owner.state, Slicer(self.owner.node.clock)
        heap = list(state.heaps.leases) if len(state.heaps.leases) < len(state.jobs) else None
        for item in heap if heap is not None else list(state.jobs.values()):
            rec = state.heaps.live_lease(item[1], item[2], item[0]) \
                if isinstance(item, tuple) else item
            if rec is not None and rec.state == LEASED and rec.lease_worker:
                held.setdefault(worker_of(rec.lease_worker), []).append(rec.job_id)
            await slicer.tick()
        now = self.owner.node.clock.now()
        self._prune(now)
        rows = sorted(self.rows.values(), key=lambda r: (r.first_seen, r.worker))[offset:]
        page, more = protocol.page(rows, lambda r: worker_row(r, held.get(r.worker, [])),
                                   limit)
        return {"workers": page, "total": len(self.rows), "more": more,
                "next_offset": offset + len(page), "now": now}


def worker_row(row: WorkerRow, held: list[str]) -> dict[str, Any]:
    return {"worker": row.worker, "node": row.node, "slots": row.slots,
            "concurrency": row.concurrency, "prefetch": row.prefetch,
            "heartbeat": row.heartbeat, "held": held[:MAX_HELD_SHOWN],
            "held_count": len(held), "first_seen": row.first_seen,
            "last_seen": row.last_seen, **row.counts}


def _note_info(row: WorkerRow, info: object) -> None:
    """A claim's ``wi`` field, taken only when it is four integers in range."""
    if type(info) is not list or len(info) != 4 \
            or not all(type(x) is int for x in info):
        return
    slots, concurrency, prefetch, heartbeat = info
    if 0 < slots <= MAX_WORKER_SLOTS and 0 < concurrency <= slots \
            and -1 <= prefetch <= slots and heartbeat in (0, 1):
        row.slots, row.concurrency = slots, concurrency
        row.prefetch, row.heartbeat = prefetch, bool(heartbeat)
