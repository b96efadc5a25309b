"""The requests a :class:`istos_nb.live.attach.LiveQueue` makes: coroutines run on its own loop.

One :class:`OwnerRequests` per LiveQueue, holding its Zenoh transport. Each method is one
operation as the LiveQueue offers it (paging, halving pages that do not fit in one message,
frames built with ``_liveframes``); :meth:`OwnerRequests.ask` sends each through the engine's
request path (:mod:`istos.client`), as the producer's and the CLI's calls go.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

from istos.client import Clients, Remote, ReplyTooLarge
from istos.client.pages import dead_pages, jobs_pages, workers_pages
from istos.core.state import STATES
from istos.errors import ConfigError, JobNotFound
from istos.lifecycle import check_update
from istos.owner.views.workflow_view import fill_states
from istos.payload import CodecChain
from istos.protocol import MAX_EVENTS
from istos.transport.base import Transport

from . import reply_tables as lf

BATCH_COLUMNS = ["batch_id", "description", "closed", "total", "pending", "done", "dead",
                 "cancelled", "created_at", "finished_at", "parent_id", "callbacks"]


class OwnerRequests:
    """Requests to one queue's owner through ``transport``, each bounded by ``timeout_s``."""

    def __init__(self, transport: Transport, queue: str, prefix: str,
                 timeout_s: float, payload: CodecChain | None = None) -> None:
        self.transport, self.queue, self.prefix, self.timeout_s = (
            transport, queue, prefix, timeout_s)
        self.payload = payload  # decodes bodies encoded by payload codecs (None: shows them)
        self.clients = Clients(Remote(transport, prefix, timeout_s))

    async def ask(self, op: str, timeout_s: float | None = None,
                  **fields: Any) -> dict[str, Any]:
        """One request, on the loop thread, through the engine's request path
        (:class:`istos.client.OwnerClient`: retried while nobody serves the key; the owner's
        typed error raised; :class:`ReplyTooLarge` above the message cap)."""
        return await self.clients(self.queue).call(op, timeout_s, **fields)

    async def stats(self) -> dict[str, Any]:
        return dict((await self.ask("stats"))["stats"])

    async def jobs(self, states: list[str | None], where: dict[str, Any], limit: int | None,
                   offset: int, filters: dict[str, Any] | None = None) -> pd.DataFrame:
        """``jobs_of`` each state; several are merged oldest first, their attrs combined, and
        ``offset`` counts in the merged order (each state is read from its start: the page
        from ``offset`` may hold any mix of them)."""
        if len(states) == 1:
            return await self.jobs_of(states[0], where, limit, offset, filters)
        want = None if limit is None else offset + limit
        parts = [await self.jobs_of(s, where, want, 0, filters) for s in states]
        rows = pd.concat([p for p in parts if len(p)] or parts[:1], ignore_index=True)
        rows = rows.sort_values("enqueued_at", kind="stable", ignore_index=True)
        totals = [p.attrs["total"] for p in parts]
        end = None if limit is None else offset + limit
        shown = rows.iloc[offset:end].reset_index(drop=True)
        shown.attrs = {"total": None if None in totals else sum(totals), "offset": offset,
                       "truncated": offset + len(shown) < len(rows)
                       or any(p.attrs["truncated"] for p in parts)}
        return shown

    async def jobs_of(self, state: str | None, where: dict[str, Any], limit: int | None,
                      offset: int, filters: dict[str, Any] | None = None) -> pd.DataFrame:
        """Pages of one state from ``offset``; one row beyond ``limit`` says if more exist."""
        want = None if limit is None else limit + 1
        notes: dict[str, int] = {}
        rows, more, total = await jobs_pages(self.clients(self.queue), state, where, want,
                                             offset, filters, notes)
        truncated = limit is not None and len(rows) > limit
        rows = rows if limit is None else rows[:limit]
        if total is None and not truncated and not more and (rows or not offset):
            total = offset + len(rows)
        elif total is None and not where and not filters:
            counts = (await self.stats())["counts"]
            total = counts.get(state, 0) if state else sum(counts.values())
        df = lf.jobs_table(rows, self.payload)
        df.attrs = {"total": total, "offset": offset, "truncated": truncated or more}
        if notes.get("unsearched"):  # encoded bodies the owner could not search
            df.attrs["unsearched"] = notes["unsearched"]
        return df

    async def dead(self, limit: int | None) -> pd.DataFrame:
        return lf.dead_table(await dead_pages(self.clients(self.queue), limit), self.payload)

    async def leases(self) -> pd.DataFrame:
        return lf.table(lf.LEASE_COLUMNS, (await self.ask("leases"))["leases"])

    async def why(self, job_id: str) -> dict[str, Any]:
        why = lf.readable_why(await self.raw_why(job_id), self.payload)
        why.pop("_job", None)
        return why

    async def raw_why(self, job_id: str) -> dict[str, Any]:
        """The owner's ``why``; a workflow step's workflow gets every job's ``state``."""
        why = dict((await self.ask("why", job_id=job_id))["why"])
        flow = why.get("workflow")
        if isinstance(flow, dict):
            flow["jobs"] = await fill_states(flow, self.ask_queue)
        return why

    async def ask_queue(self, queue: str, op: str, **fields: Any) -> dict[str, Any]:
        """One request to another queue's owner under the same prefix (workflow steps)."""
        return await self.clients(queue).call(op, **fields)

    async def job(self, job_id: str) -> dict[str, Any]:
        raw = await self.raw_why(job_id)
        why = lf.readable_why(raw, self.payload)
        rec = why.pop("_job", None)
        if rec is None:
            raise JobNotFound(f"queue {self.queue!r} holds no job {job_id!r}: {why['reason']}")
        dead = raw.get("dead_letter")
        if isinstance(dead, dict):  # a dead job's body and history come in its dead letter
            history, data = dead.get("history") or [], why["dead_letter"]["data"]
        else:
            history, data = rec.pop("history", []), lf.decode(rec.pop("body", None),
                                                                self.payload)
        record = {k: lf.instant(v) if k.endswith("_at") or k == "deadline" else v
                  for k, v in rec.items() if k not in ("body", "history")}
        logs = [{"attempt": a.get("attempt"), "line": line}  # ctx.log(), oldest first
                for a in history for line in a.get("logs") or ()]
        return {"job_id": job_id, "state": why["state"], "record": record, "why": why,
                "attempts": lf.attempts_table(history), "data": data, "logs": logs}

    async def ring(self, limit: int) -> list[dict[str, Any]]:
        """The owner's latest ``limit`` events, fewer if they do not fit in one reply (its
        ring cannot be paged: halve until the most recent ones fit)."""
        ask = min(limit, MAX_EVENTS)
        while True:
            try:
                return list((await self.ask("events", limit=ask))["events"])
            except ReplyTooLarge:
                if ask == 1:
                    raise
                ask //= 2

    async def admin(self, op: str, **fields: Any) -> dict[str, Any]:
        return await self.ask(op, **fields)

    async def workers(self) -> pd.DataFrame:
        return lf.workers_table(await workers_pages(self.clients(self.queue)))

    async def batches(self, limit: int) -> pd.DataFrame:
        """The batches this queue is home to (``batches``): open ones first."""
        reply = await self.ask("batches", limit=limit)
        frame = pd.DataFrame(reply["batches"], columns=BATCH_COLUMNS)
        frame.attrs.update(total=reply["total"], open=reply["open"])
        return frame

    async def batch_members(self, batch_id: str, state: str | None,
                            limit: int) -> pd.DataFrame:
        """One batch's members as this queue (its home) counts them (``batch_members``)."""
        reply = await self.ask("batch_members", batch_id=batch_id, state=state, limit=limit)
        frame = pd.DataFrame(reply["members"], columns=["job_id", "queue", "state"])
        frame.attrs["more"] = bool(reply["more"])
        return frame

    async def bulk(self, op: str, count_key: str, **fields: Any) -> int:
        """One bulk admin op repeated until the owner says none is left; the total."""
        total = 0
        while True:
            reply = await self.ask(op, **fields)
            total += int(reply[count_key])
            if not reply.get("more") or not reply[count_key]:
                return total


def jobs_args(state: str | Iterable[str] | None, where: dict[str, Any] | None,
               limit: int | None, offset: int
               ) -> tuple[list[str | None], dict[str, Any], int | None, int]:
    """``jobs()``'s arguments checked (ConfigError, a ValueError, naming the bad one) and
    normalised."""
    states: list[str | None] = [state] if state is None or isinstance(state, str) \
        else list(state)
    for s in states:
        if s is not None and s not in STATES:
            raise ConfigError(f"state must be one of {', '.join(STATES)} or None, got {s!r}")
    if not states:
        raise ConfigError("state: give at least one state, or None for all")
    if (limit is not None and limit < 1) or offset < 0:
        raise ConfigError(f"need limit >= 1 (or None) and offset >= 0, got {limit!r}, {offset!r}")
    return states, dict(where or {}), limit, offset


def search_filters(error: str | None, worker: str | None, enqueued: Any, finished: Any
                   ) -> dict[str, Any]:
    """``jobs()``'s search arguments as request fields: texts, and ``(after, before)`` pairs
    of instants (epoch seconds, datetimes or Timestamps; either end None)."""
    out: dict[str, Any] = {}
    for name, value in (("error", error), ("worker", worker)):
        if value is not None:
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{name} must be a non-empty string, got {value!r}")
            out[name] = value
    for name, span in (("enqueued", enqueued), ("finished", finished)):
        if span is None:
            continue
        if not isinstance(span, (tuple, list)) or len(span) != 2:
            raise ConfigError(f"{name} must be an (after, before) pair, got {span!r}")
        for end, value in zip(("after", "before"), span):
            if value is not None:
                out[f"{name}_{end}"] = _epoch(value, f"{name} {end}")
    return out


def _epoch(value: Any, what: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        return float(pd.Timestamp(value).timestamp())
    except (TypeError, ValueError):
        raise ConfigError(f"{what}: not an instant: {value!r}") from None


def purge_fields(job_ids: Iterable[str] | None) -> dict[str, Any]:
    if isinstance(job_ids, str):
        job_ids = [job_ids]  # one id, not its characters
    return {} if job_ids is None else {"job_ids": [str(j) for j in job_ids]}


def update_fields(queue: str, payload: CodecChain | None, job_id: str, data: Any,
                  delay_s: object, run_at: object, priority: object) -> dict[str, Any]:
    """The ``update`` op's fields (``job_id`` and what changes), checked as
    :meth:`istos.Istos.update` checks them, the new body through the queue's payload codecs.
    Raises ConfigError naming the field, or InvalidJob for data that cannot be encoded."""
    fields = check_update(queue, job_id, data, delay_s, run_at, priority)
    if "body" in fields and payload is not None and payload.codecs:
        fields["body"] = payload.wrap(fields["body"], queue=queue)
    return {"job_id": job_id, **fields}
