"""Bulk admin actions of one owner (what bull-board and Flower call "retry all", "promote",
"clean"): ``requeue_all_dead``, ``promote`` and ``purge_dead_older``.

Each is one bounded request: it changes at most ``MAX_BULK`` jobs (a thousand by default, never
more than one group commit's worth), writes them in one commit (write, then apply: a failed
write changes nothing) and says in ``more`` whether jobs it would have taken remain, so a client
repeats it until ``more`` is false. Every op is admin-only (``AdminDisabled`` unless the queue
was declared with ``admin=True``), refused before anything is looked at.

``requeue_all_dead`` (``redrive_dead`` in the API and ``istos redrive-dead``, as SQS calls moving
dead letters back) moves dead letters back to ready *under the same id*, afresh (attempts 0),
like ``app.revive`` does for one: a chain step continues its chain, a chord member still counts.
``error`` keeps only those whose last error contains that text (case-sensitive).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from ... import protocol
from ...core.state import DELAYED
from ..extension import Handler, OwnerExtension
from ..handle import OwnerHandle

MAX_BULK = protocol.MAX_BULK


class BulkAdmin(OwnerExtension):
    """The bulk admin ops of one owner."""

    name = "bulk_admin"
    serves = ("requeue_all_dead", "promote", "purge_dead_older")

    def __init__(self, owner: OwnerHandle) -> None:
        self.owner = owner

    def ops(self) -> Mapping[str, Handler]:
        return {"requeue_all_dead": self.op_redrive_dead, "promote": self.op_promote,
                "purge_dead_older": self.op_purge_older}

    def _limit(self, msg: dict[str, Any]) -> int:
        return min(MAX_BULK, int(msg.get("limit", MAX_BULK)))

    async def op_redrive_dead(self, msg: dict[str, Any]) -> dict[str, Any]:
        """The ``requeue_all_dead`` op (``redrive_dead``): dead letters (those whose last error
        contains ``error``, if given) back to ready under their own ids."""
        self.owner.require_admin("requeue_all_dead")
        needle, limit = msg.get("error"), self._limit(msg)
        state, now = self.owner.state, self.owner.node.clock.now()
        matching = (rec.job_id for rec in state.dead.values()
                    if needle is None or needle in (rec.last_error or ""))
        chosen = list(itertools.islice(matching, limit + 1))
        more = len(chosen) > limit
        for job_id in chosen[:limit]:
            state.revive_dead(job_id, now)
        await self.owner.writes.commit()
        return {"requeued": min(len(chosen), limit), "more": more}

    async def op_promote(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Delayed jobs (the given ``job_ids``, or the ones due soonest) made ready now."""
        self.owner.require_admin("promote")
        state, now, limit = self.owner.state, self.owner.node.clock.now(), self._limit(msg)
        ids = msg.get("job_ids")
        if ids is None:
            delayed = sorted((rec.ready_at, rec.seq, rec.job_id)
                             for rec in state.jobs.values() if rec.state == DELAYED)
            wanted = [job_id for _, _, job_id in delayed[:limit + 1]]
        else:
            wanted = list(dict.fromkeys(ids))[:limit + 1]
        more = len(wanted) > limit
        promoted = sum(1 for job_id in wanted[:limit] if state.promote(job_id, now))
        await self.owner.writes.commit()
        return {"promoted": promoted, "more": more}

    async def op_purge_older(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Dead letters that died at least ``older_than_s`` seconds ago, deleted."""
        self.owner.require_admin("purge_dead_older")
        state, now, limit = self.owner.state, self.owner.node.clock.now(), self._limit(msg)
        cutoff = now - float(msg["older_than_s"])
        old = (rec.job_id for rec in state.dead.values()
               if rec.finished_at is not None and rec.finished_at <= cutoff)
        chosen = list(itertools.islice(old, limit + 1))
        purged = state.purge_dead(now, chosen[:limit])
        await self.owner.writes.commit()
        return {"purged": purged, "more": len(chosen) > limit}
