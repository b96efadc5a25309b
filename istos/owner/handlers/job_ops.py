"""The owner's job ops: what workers and producers ask of a queue besides ``enqueue``.

``claim`` (with piggybacked acks/nacks), ``settle``, ``ack``, ``nack``, ``release``, ``result``
and ``dead``; request and reply fields are in docs/protocol.md and :mod:`istos.protocol`. Each
handler changes the pure state, then commits through the owner's write path (write, then apply;
see ``owner.py``).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping
from typing import Any

from ... import protocol
from ...core.expiry import claim_start_by
from ...core.records import DEAD, DELAYED, DONE, EXPIRED, READY, JobRecord
from ...core.trace_meta import without_trace
from ...core.workflow_meta import public_meta
from ...errors import IstosError, ProtocolError
from ..extension import Handler
from ..handle import OwnerHandle
from ..views.eventlog import fields_of
from .fit import fit_item, log_pages
from .throttle import RefillNudge

log = logging.getLogger("istos.owner")

MAX_RELEASES = protocol.MAX_RELEASES


class JobOps:
    """The job ops of one owner (served by it from the start)."""

    def __init__(self, owner: OwnerHandle) -> None:
        self.owner = owner
        self.state = owner.state
        # Only a rate-limited queue has one (``throttle.py``): the others pay nothing.
        pol = owner.config.policy
        self.refill = RefillNudge(owner) \
            if pol.rate_limit is not None or pol.group_rate_limit is not None else None

    def ops(self) -> Mapping[str, Handler]:
        return {"claim": self.op_claim, "ack": self.op_ack, "nack": self.op_nack,
                "settle": self.op_settle, "result": self.op_result, "dead": self.op_dead,
                "release": self.op_release, "logs": self.op_logs}

    async def op_claim(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Claim one job per listed worker slot, after settling the acks/nacks the worker
        piggybacked on the request (one round trip instead of two)."""
        owner = self.owner
        gen = owner.writes.generation
        settled = await self.settle(msg["settle"]) if msg.get("settle") else None
        workers: list[str] = msg["workers"]
        # Slots are filled only while the reply stays under the frame cap; the first job is
        # always taken (a body at the size limit fits a reply alone).
        budget = protocol.PAGE_BUDGET - 8 * len(settled or ())
        now = owner.node.clock.now()
        jobs = self.state.claim(workers, now, budget=budget, size_of=_claimed_size)
        node: str = msg.get("node") or ""
        more = len(jobs) < len(workers) and self.state.counts[READY] > 0 \
            and not self.state.paused
        if more and self.state.limited:  # a rate or group limit cut it, not the frame cap:
            more = False  # no nudge now (it would find the same limit: a busy loop)
            if self.refill is not None:
                self.refill.after_claim(now)  # ...but when a token returns
        owner.hungry.note_claim(node, len(workers) - len(jobs), took=bool(jobs), cut=more)
        if more:
            owner.nudge(0)  # the poked node comes back for the rest at once
        await owner.writes.commit(gen)
        pol = owner.config.policy
        reply: dict[str, Any] = {"jobs": [
            {"job_id": r.job_id, "body": r.body, "attempt": r.attempts, "token": r.lease_token,
             "worker": r.lease_worker, "deadline": r.lease_deadline,
             "last_error": r.last_error, "meta": r.meta}
            for r in jobs], "max_attempts": pol.max_attempts, "keep_results": pol.keep_results,
            "lease_s": pol.lease_s}
        if self.state.heaps.starts.heap:  # (empty: no waiting job had a start deadline)
            for r, entry in zip(jobs, reply["jobs"]):
                if r.start_by is not None and (start_by := claim_start_by(r)) is not None:
                    entry["start_by"] = start_by  # a prefetched job past it goes back unrun
        if more:
            reply["more"] = True
        if settled is not None:
            reply["settled"] = settled
        return reply

    async def op_settle(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Acks and nacks of several deliveries in one request, written in one group commit."""
        gen = self.owner.writes.generation
        statuses = await self.settle(msg["items"])
        await self.owner.writes.commit(gen)
        return {"statuses": statuses}

    async def settle(self, items: list[dict[str, Any]]) -> list[str]:
        statuses = []
        now = self.owner.node.clock.now()  # one instant for the batch, as for one write
        for item in items:  # each item was checked against protocol.SETTLE_ITEM
            job_id, token = item["job_id"], item["token"]
            try:
                if item.get("op") == "nack":
                    statuses.append(self.nack_one(job_id, token, item.get("error"),
                                                  item.get("traceback"),
                                                  item.get("retry_after")))
                else:
                    statuses.append(await self.ack_one(job_id, token, item.get("result"), now))
            except IstosError as exc:  # e.g. a chord callback that could not be enqueued
                log.warning("queue %s: ack of %s refused: %s", self.owner.name, job_id, exc,
                            extra=fields_of(self.owner.name, job_id, self.state.jobs.get(job_id)))
                statuses.append("error")  # left to its lease: it comes back and retries
        if self.state.heaps.groups is not None and self.state.counts[READY]:
            # A settled grouped job may free its group's slot (group_concurrency): wake the
            # workers the cap held back, as a new job would.
            freed = statuses.count("ok")
            if freed:
                self.owner.nudge(freed)
        return statuses

    async def ack_one(self, job_id: str, token: str, result: bytes | None,
                      now: float | None = None) -> str:
        owner, state = self.owner, self.state
        if owner.before_ack_hooks(True):
            # Hooks that only want workflow steps (jobs with meta) skip every other ack.
            rec = state.jobs.get(job_id)
            hooks = owner.before_ack_hooks(rec is not None and bool(without_trace(rec.meta)))
            if hooks and state.holder(job_id, token) is not None:
                assert rec is not None
                for ext in hooks:  # workflow barriers, before the ack is recorded
                    await ext.before_ack(rec, result)
                now = None  # the hooks may have waited: the ack's time is after them
        return state.ack(job_id, token, owner.node.clock.now() if now is None else now, result)

    def nack_one(self, job_id: str, token: str, error: str | None,
                 traceback: str | None = None, retry_after: float | None = None) -> str:
        node = self.owner.node
        return self.state.nack(job_id, token, node.clock.now(), protocol.clip_error(error),
                               node.rng, protocol.clip_traceback(traceback),
                               retry_after=retry_after)

    async def op_ack(self, msg: dict[str, Any]) -> dict[str, Any]:
        gen = self.owner.writes.generation
        status = await self.ack_one(msg["job_id"], msg["token"], msg.get("result"))
        await self.owner.writes.commit(gen)
        return {"status": status}

    async def op_nack(self, msg: dict[str, Any]) -> dict[str, Any]:
        status = self.nack_one(msg["job_id"], msg["token"], msg.get("error"),
                               msg.get("traceback"), msg.get("retry_after"))
        await self.owner.writes.commit()
        return {"status": status}

    async def op_release(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Deliveries handed back unfinished by a worker shutting down: ready at once, their
        attempts not counted (``items``: ``job_id`` and ``token`` of each)."""
        items = msg["items"]
        if len(items) > MAX_RELEASES:
            raise ProtocolError(f"{len(items)} releases in one request; the limit is "
                                f"{MAX_RELEASES}")
        now = self.owner.node.clock.now()
        statuses = [self.state.release(str(i["job_id"]), str(i["token"]), now) for i in items]
        await self.owner.writes.commit()
        return {"statuses": statuses}

    async def op_result(self, msg: dict[str, Any]) -> dict[str, Any]:
        rec = self.state.jobs.get(msg["job_id"])
        if rec is None:
            return {"state": "unknown", "result": None}
        result = rec.result if rec.state == DONE else None
        out: dict[str, Any] = {"state": rec.state, "result": result}
        if rec.state in (READY, DELAYED):
            out["state"] = READY  # the spec reports in-flight jobs as ready or leased
        if rec.state in (DEAD, EXPIRED):
            out["error"] = rec.last_error
        return out

    async def op_dead(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Dead letters, oldest first, paged by count (``limit`` <= 1000) and by bytes, so a
        page never exceeds the frame cap; ``more`` says whether a next page exists."""
        offset = msg.get("offset", 0)
        limit = min(protocol.MAX_PAGE, msg.get("limit", protocol.MAX_PAGE))
        dead, more = protocol.page(itertools.islice(self.state.dead.values(), offset, None),
                                   dead_letter, limit)
        return {"dead": dead, "total": len(self.state.dead), "more": more,
                "next_offset": offset + len(dead)}

    async def op_logs(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The ``ctx.log()`` lines a job's kept attempts wrote, whole, a page of attempts at a
        time (after attempt number ``after``): what ``why`` and ``dead`` leave out to fit."""
        rec = self.state.jobs.get(msg["job_id"])
        if rec is None:
            return {"state": "unknown", "attempts": [], "more": False, "next_after": 0}
        attempts, more = log_pages(rec.history, msg.get("after", 0))
        last = attempts[-1]["attempt"] if attempts else msg.get("after", 0)
        return {"state": rec.state, "attempts": attempts, "more": more, "next_after": last}


def dead_letter(rec: JobRecord, room: int = protocol.PAGE_BUDGET) -> dict[str, Any]:
    """The spec's dead-letter fields plus the attempt history (body still encoded), within
    ``room`` encoded bytes: logs that do not fit are left out and counted (``fit.py``)."""
    letter = dead_letter_fields(rec)
    return fit_item(letter, letter["history"], room)


def dead_letter_fields(rec: JobRecord) -> dict[str, Any]:
    """A dead letter with its whole history (for a reply that fits it with more around it)."""
    return {"job_id": rec.job_id, "body": rec.body, "attempts": rec.attempts,
            "last_error": rec.last_error, "history": [a.to_dict() for a in rec.history],
            "meta": public_meta(rec.meta), "finished_at": rec.finished_at}


def _claimed_size(rec: JobRecord, worker: str) -> int:
    return protocol.claimed_size(rec.job_id, rec.body, worker, rec.last_error, rec.meta) \
        + (0 if rec.start_by is None else 24)
