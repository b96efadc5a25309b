"""HA owner failover: liveliness for speed, a storage-backed leader lease with an epoch for safety.

Every replica declares a liveliness token ``{prefix}/ha/{queue}/{candidate}`` and watches the
others'; candidates are ``{start time}-{node id}``, so they sort oldest first. Who *may* lead is
decided by the shared storage: a leader lease ``ha:{queue}`` (holder, epoch, expiry; see
:meth:`~istos.storage.base.Storage.acquire_leader`). A replica leads only while it holds the
lease at its epoch:

- The leader renews the lease every ``renew_every`` (a quarter of ``ha_lease_s``, at most 0.25 s).
  If a renewal is refused (another epoch began), or it has not renewed for ``ha_lease_s``
  (storage unreachable), it stops serving at once. A leader whose renewals fail times its next
  attempt to the moment its lease lapses, so it stands down then (plus the storage call in
  flight), not up to an interval later.
- Every write the leader makes carries its epoch as a fence, checked atomically with the write;
  a refused write stops it at once too. Its memory may be stale, so it never serves again from
  it: the next time it wins, a fresh owner reloads the queue from storage.
- A standby tries to acquire the lease when it is free or expired and the standby is the first
  alive candidate other than the holder (or is the holder itself). A clean stop releases the
  lease, so takeover is immediate.
- Liveliness is the fast path for a death: when the holder's token drops *and* the lease then
  goes unrenewed for 1.5 renewal intervals, the first alive standby takes it over without
  waiting for the expiry (``steal_from``). A partitioned leader that still reaches storage keeps
  renewing and so keeps its lease: the epoch, not the mesh, decides.

Takeover therefore takes about 1.5 renewal intervals after a process death (its token drops at
once), and at most ``ha_lease_s`` plus one renewal interval after a freeze or a partition from
the storage. A frozen leader that resumes finds its lease lapsed or taken: it serves nothing
(requests get an error reply, so a live leader's reply wins) and steps down.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ...cancel_guard import reraise_swallowed, within
from ...core.config import QueueConfig
from ...errors import StorageUnavailable
from ...node import Node
from ...storage.base import Fence, LeaderLease
from ...wakeup import Wakeup
from ..owner import QueueOwner

StartOwner = Callable[[Fence], Awaitable[QueueOwner]]
"""Bind the queue on this node as the leader of the fence's epoch (recovering from storage)."""
StopOwner = Callable[[], Awaitable[None]]
"""Unbind the queue's owner on this node, if any."""
CurrentOwner = Callable[[], "QueueOwner | None"]
"""The queue's owner bound on this node now, if any."""

log = logging.getLogger("istos.election")


class Election:
    """The election for one ``ha=True`` queue on one replica.

    It runs on ``node``'s transport, storage and clock, and brings the queue's owner up and
    down only through the three callables the app hands it.
    """

    def __init__(self, config: QueueConfig, node: Node, *, start_owner: StartOwner,
                 stop_owner: StopOwner, current_owner: CurrentOwner) -> None:
        self.config = config
        self.node = node
        self._start_owner, self._stop_owner = start_owner, stop_owner
        self._current_owner = current_owner
        self.candidate = ""
        self.leading = False
        self.epoch: int | None = None
        self.alive: set[str] = set()
        self.gone: set[str] = set()  # candidates whose token was seen to drop
        self.transitions = 0
        self.lease_name = f"ha:{config.name}"
        self.lease_s = config.ha_lease_s
        self.renew_every = min(self.lease_s / 4, 0.25)
        self._renewed_at = float("-inf")
        self._renew_failed = False  # the last renewal attempt raised StorageUnavailable
        self._unrenewed: dict[str, tuple[float, float]] = {}  # holder -> (expiry, first seen)
        self._token: Any = None
        self._watch: Any = None
        self._wake = Wakeup()
        self._task: asyncio.Task[None] | None = None

    def _expr(self) -> str:
        return f"{self.node.prefix}/ha/{self.config.name}"

    async def start(self) -> None:
        transport = self.node.transport
        assert transport is not None
        stamp = int(self.node.clock.now() * 1e6)
        self.candidate = f"{stamp:020d}-{self.node.node_id}"
        self._watch = await transport.watch_liveliness(f"{self._expr()}/*", self._on_token)
        self._token = await transport.declare_liveliness_token(
            f"{self._expr()}/{self.candidate}")
        self._task = asyncio.get_running_loop().create_task(self._follow())

    def _on_token(self, key: str, alive: bool) -> None:
        candidate = key.rsplit("/", 1)[-1]
        if alive:
            self.alive.add(candidate)
            self.gone.discard(candidate)
        else:
            self.alive.discard(candidate)
            self.gone.add(candidate)
        self._wake.set()

    def leader(self) -> str | None:
        """The replica this one believes leads (itself when leading), else the first alive."""
        if self.leading:
            return self.candidate
        return min(self.alive) if self.alive else None

    async def _follow(self) -> None:
        """One step per renewal interval or liveliness change, strictly in order."""
        clock = self.node.clock
        while True:
            try:
                if self.leading:
                    await self._renew_in_time()
                else:
                    await self._try_to_lead()
            except StorageUnavailable as exc:
                log.debug("queue %s: election step failed: %s", self.config.name, exc)
                self._renew_failed = self.leading
                if self.leading and clock.now() - self._renewed_at >= self.lease_s:
                    await self._step_down("could not renew its leader lease")
            except Exception:
                log.exception("queue %s: election step failed", self.config.name)
            # A stop cancels this task; a step whose storage swallowed that cancel (an
            # adapter that waits with wait_for, Python 3.11) must not keep it running.
            reraise_swallowed(0)
            self._wake.clear()
            await self._wake.wait(clock.to_loop_seconds(self._next_step()))

    def _next_step(self) -> float:
        """Seconds to the next step: one renewal interval, or less for a leader whose lease
        runs out sooner (its renewals failed), so that it stands down as the lease lapses
        rather than up to an interval later."""
        if not self.leading:
            return self.renew_every
        left = self._renewed_at + self.lease_s - self.node.clock.now()
        return min(self.renew_every, left) if left > 0 else self.renew_every

    async def _renew_in_time(self) -> None:
        """Renew. After a failed renewal, the attempt gets only what is left of the lease, so
        a store that does not answer cannot keep a lapsed leader from standing down; raises
        StorageUnavailable when that runs out. (A leader that was frozen, not failing, tries
        whatever is left: its renewal may still be accepted.)"""
        if not self._renew_failed:
            await self._renew()
            return
        clock = self.node.clock
        left = self._renewed_at + self.lease_s - clock.now()
        try:
            await within(self._renew(), clock.to_loop_seconds(max(left, 0.0)))
        except asyncio.TimeoutError:
            raise StorageUnavailable("the leader lease ran out while it was being renewed") \
                from None

    async def _renew(self) -> None:
        assert self.epoch is not None
        clock, storage = self.node.clock, self.node.storage
        asked_at = clock.now()  # the lease runs from when we asked, not from the answer
        ok = await storage.renew_leader(self.lease_name, self.candidate, self.epoch,
                                        now=asked_at, ttl_s=self.lease_s)
        if not ok:
            await self._step_down(f"epoch {self.epoch} ended")
            return
        self._renewed_at, self._renew_failed = asked_at, False
        owner = self._current_owner()
        if owner is not None:
            owner.lead_until(asked_at + self.lease_s)

    async def _try_to_lead(self) -> None:
        clock, storage = self.node.clock, self.node.storage
        lease = await storage.read_leader(self.lease_name)
        now = clock.now()
        steal: str | None = None
        if lease is not None and lease.expires_at > now and lease.holder != self.candidate:
            steal = self._dead_holder(lease, clock.monotonic())
            if steal is None:
                return
        if not self._first_in_line(lease):
            return
        epoch = await storage.acquire_leader(self.lease_name, self.candidate, now=now,
                                             ttl_s=self.lease_s, steal_from=steal)
        if epoch is None:
            return
        fence = Fence(self.lease_name, epoch, self.candidate)
        try:
            owner = await self._start_owner(fence)
        except Exception:
            log.exception("queue %s: taking over failed; retrying", self.config.name)
            await self._stop_owner()
            return
        owner.lead_until(now + self.lease_s)
        owner.wake_election_with(self._wake.set)  # fenced or lapsed: renew (or step down) now
        self.epoch, self._renewed_at, self.leading = epoch, now, True
        self._renew_failed = False
        self.transitions += 1
        log.info("queue %s: %s leads at epoch %d", self.config.name, self.candidate, epoch)

    def _dead_holder(self, lease: LeaderLease, mono: float) -> str | None:
        """The holder, if its token dropped and it has not renewed for 1.5 intervals since."""
        if lease.holder not in self.gone or lease.holder in self.alive:
            self._unrenewed.pop(lease.holder, None)
            return None
        seen = self._unrenewed.get(lease.holder)
        if seen is None or seen[0] != lease.expires_at:
            self._unrenewed[lease.holder] = (lease.expires_at, mono)
            return None
        return lease.holder if mono - seen[1] >= 1.5 * self.renew_every else None

    def _first_in_line(self, lease: LeaderLease | None) -> bool:
        if lease is not None and lease.holder == self.candidate:
            return True  # our own lease (we stepped down, or restarted): re-acquire it
        others = self.alive - {lease.holder} if lease is not None else set(self.alive)
        others.add(self.candidate)
        return min(others) == self.candidate

    async def _step_down(self, why: str) -> None:
        owner = self._current_owner()
        if owner is not None:
            owner.fenced()  # stop serving at once, before any await
        self.leading, self.epoch, self._renew_failed = False, None, False
        self.transitions += 1
        log.warning("queue %s: %s stands down: %s", self.config.name, self.candidate, why)
        await self._stop_owner()

    def kill(self) -> None:
        """Stop at once (a simulated crash): no renewal, no release, nothing written."""
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        for handle in (self._token, self._watch):
            if handle is not None:
                handle.close()
        self._token = self._watch = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.leading:
            epoch, self.leading, self.epoch = self.epoch, False, None
            await self._stop_owner()
            if epoch is not None:
                try:  # a clean stop hands over at once instead of after the lease
                    await self.node.storage.release_leader(self.lease_name, self.candidate, epoch)
                except StorageUnavailable as exc:
                    log.warning("queue %s: could not release the leader lease: %s",
                                self.config.name, exc)
