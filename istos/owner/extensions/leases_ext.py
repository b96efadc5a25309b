"""The owner's side of heartbeats and cancellation: the ``extend`` and ``cancel`` ops.

Installed on every owner (like the inspector) as an owner extension: two extra ops, and
a wrapper around ``claim`` whose reply also names this worker node's jobs that were cancelled
while it held them (so a worker without heartbeats still learns at its next claim). A cancel of
a leased job is also sent at once as a targeted message on ``{prefix}/q/{queue}/cancel``; that
message may be lost, the claim and extend replies are the reliable path. The transitions
themselves are pure (``leasing.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from ... import codec
from ...context import check_progress
from ...core import leasing
from ...core.state import LEASED
from ...errors import InvalidProgress, ProtocolError
from ..extension import Handler, OwnerExtension, not_wrapped
from ..handle import OwnerHandle
from ..views.eventlog import fields_of

log = logging.getLogger("istos.owner")

CancelListener = Callable[[str, list[str]], None]  # (worker node, job ids)


class LeaseOps(OwnerExtension):
    name = "leases"
    serves = ("extend", "cancel")
    wraps = ("claim", "settle")

    def __init__(self, owner: OwnerHandle, *, on_cancel: CancelListener | None = None) -> None:
        self.owner = owner
        # Leased jobs marked for cancellation, by the node holding them (for claim replies).
        self.marked: dict[str, str] = {}
        self.cancel_listeners: list[CancelListener] = [] if on_cancel is None else [on_cancel]
        self._claim: Handler = not_wrapped
        self._settle: Handler = not_wrapped

    def ops(self) -> Mapping[str, Handler]:
        return {"extend": self.op_extend, "cancel": self.op_cancel}

    def wrap(self, op: str, inner: Handler) -> Handler:
        if op == "claim":
            self._claim = inner
            return self._op_claim
        self._settle = inner
        return self._op_settle

    async def op_extend(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Renew a batch of leases; one status per item (``ok``, ``stale``, ``cancel``)."""
        items = msg["items"]
        if not isinstance(items, list) or len(items) > leasing.MAX_EXTEND_ITEMS:
            raise ProtocolError(f"extend needs a list of at most {leasing.MAX_EXTEND_ITEMS} "
                                "items")
        for item in items:  # the whole request is checked before any lease changes
            if not isinstance(item, dict) or not isinstance(item.get("job_id"), str) \
                    or not isinstance(item.get("token"), str):
                raise ProtocolError("each extend item needs string job_id and token")
            check_progress(item.get("progress"), item.get("note"))
        state, now = self.owner.state, self.owner.node.clock.now()
        statuses = [leasing.extend(state, item, now) for item in items]
        await self.owner.writes.commit()
        return {"statuses": statuses}

    async def op_cancel(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Admin: cancel one job (see :func:`leasing.cancel` for the statuses)."""
        self.owner.require_admin("cancel")
        job_id = msg["job_id"]
        if not isinstance(job_id, str):
            raise ProtocolError("cancel needs a string job_id")
        state = self.owner.state
        status = leasing.cancel(state, job_id, self.owner.node.clock.now())
        await self.owner.writes.commit()
        if status == "cancelling":
            worker = state.jobs[job_id].lease_worker or ""
            node = worker.rsplit(":", 1)[0]
            self.marked[job_id] = node
            self._tell(node, [job_id])
        return {"status": status}

    def _progress_of(self, items: object) -> None:
        """Record the progress riding on acks and nacks before they settle. A bad field (only
        a hand-made client sends one: ``ctx.progress`` checks) is dropped, never the ack."""
        if not isinstance(items, list):
            return
        state, now = self.owner.state, self.owner.node.clock.now()
        for item in items:
            if not isinstance(item, dict) or ("progress" not in item and "note" not in item
                                              and "logs" not in item):
                continue
            rec = state.jobs.get(str(item.get("job_id")))
            if rec is not None and rec.state != LEASED and "logs" in item:
                leasing.keep_late_logs(state, rec, item)  # a late ack is honoured: its lines
            if rec is None or rec.state != LEASED or \
                    not leasing.token_matches(rec, item.get("token")):
                continue
            if "logs" in item:  # kept with the attempt the ack/nack then finishes
                leasing.keep_logs(state, rec, item)
            if "progress" not in item and "note" not in item:
                continue
            try:
                leasing.record_progress(state, rec, now, item.get("progress"), item.get("note"))
            except InvalidProgress as exc:
                log.warning("queue %s: progress of %s dropped: %s", self.owner.name, rec.job_id,
                            exc, extra=fields_of(self.owner.name, rec.job_id, rec))

    async def _op_settle(self, msg: dict[str, Any]) -> dict[str, Any]:
        self._progress_of(msg.get("items"))
        return await self._settle(msg)

    async def _op_claim(self, msg: dict[str, Any]) -> dict[str, Any]:
        self._progress_of(msg.get("settle"))
        reply = await self._claim(msg)
        if self.marked:
            node = str(msg.get("node") or "")
            jobs = self.owner.state.jobs
            for job_id, holder in list(self.marked.items()):
                rec = jobs.get(job_id)
                if rec is None or rec.state != LEASED:
                    del self.marked[job_id]  # it ended (cancelled or acked): nothing to tell
                elif holder == node:
                    reply.setdefault("cancel", []).append(job_id)
        return reply

    def _tell(self, node: str, job_ids: list[str]) -> None:
        for listener in self.cancel_listeners:
            listener(node, job_ids)
        transport = self.owner.node.transport
        if node != self.owner.node.node_id and transport is not None:
            payload = codec.encode_message({"v": codec.PROTOCOL_VERSION, "to": [node],
                                            "jobs": job_ids})
            asyncio.get_running_loop().create_task(
                transport.put(self.owner.node.key(self.owner.name, "cancel"), payload))
