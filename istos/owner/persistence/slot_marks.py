"""Schedule slots remembered in durable storage, so an owner restart or failover keeps them.

:class:`~istos.core.slots.RecentSlots` is the owner's RAM: fast, and gone with the owner. With
durable storage the owner also writes a mark per accepted slot (namespace ``slots:{queue}``,
value: the time until which the slot is held, in the owner's clock), *after* the slot's job was
stored: a mark never exists without its job, so a storage outage between the two can only cost
the cross-restart memory of that slot (the job still runs; logged), never a tick. A new owner
checks the marks of a slot it does not remember before enqueueing it.

Marks past their hold are deleted by a sweep of the namespace every ``PURGE_EVERY`` marks; the
namespace holds about ``hold / period`` marks per schedule (at least 60 s of slots).
"""

from __future__ import annotations

import logging
import math

from ...errors import StorageUnavailable
from ...storage.base import Storage

log = logging.getLogger("istos.schedule")

PURGE_EVERY = 256


class SlotMarks:
    """The durable marks of one queue's accepted schedule slots."""

    def __init__(self, storage: Storage, queue: str) -> None:
        self.storage = storage
        self.ns = f"slots:{queue}"
        self._since_purge = 0

    async def held(self, slot_id: str, now: float) -> bool:
        """Whether a mark holds ``slot_id`` at ``now`` (raises StorageUnavailable)."""
        return _until(await self.storage.get(self.ns, slot_id)) > now

    async def mark(self, slot_id: str, until: float, now: float) -> None:
        """Hold ``slot_id`` until ``until``; a failed write is logged, not raised (the slot's
        job is already stored and will run)."""
        try:
            await self.storage.put(self.ns, slot_id, repr(float(until)).encode())
        except StorageUnavailable as exc:
            log.warning("%s: slot %s is enqueued but not marked in storage (%s): an owner "
                        "restart before %s could enqueue it again", self.ns, slot_id, exc, until)
            return
        self._since_purge += 1
        if self._since_purge >= PURGE_EVERY:
            self._since_purge = 0
            try:
                await self.purge(now)
            except StorageUnavailable as exc:  # the stale marks wait for the next sweep
                log.warning("%s: sweeping expired slot marks failed: %s", self.ns, exc)

    async def purge(self, now: float) -> int:
        """Delete the marks whose hold has passed; returns how many."""
        stale = [key for key, raw in await self.storage.scan(self.ns) if _until(raw) <= now]
        for key in stale:
            await self.storage.delete(self.ns, key)
        return len(stale)


def _until(raw: bytes | None) -> float:
    if raw is None:
        return -math.inf
    try:
        value = float(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        return -math.inf  # not a mark we wrote: ignore it
    return value if math.isfinite(value) else -math.inf
