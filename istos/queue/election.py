"""HA owner failover: replicas of a queue elect one leader over liveliness tokens.

Every replica declares a token ``{prefix}/ha/{queue}/{candidate}`` and watches the others'. The
leader is the alive candidate that sorts first; candidates are ``{start time}-{node id}``, so the
longest-running replica leads and a restarted replica rejoins as a standby instead of forcing a
handover. The leader binds the queue (recovering it from shared storage); a replica that sees a
candidate sorting before its own steps down at once.

This is leaderless recovery, not consensus. During a handover two owners can overlap briefly: a
leader cut off from the mesh (but not dead) keeps serving the workers it can still reach until it
notices the partition, while the new leader serves the rest. Both write through the same storage,
so no accepted job is lost, but a job can be delivered by both (at-least-once, never silent loss);
the overlap cannot produce two live leases *from one owner*.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from .config import QueueConfig

if TYPE_CHECKING:
    from ..app import Istos

log = logging.getLogger("istos.election")


class Election:
    """The election for one ``ha=True`` queue on one replica (an app plugin)."""

    def __init__(self, config: QueueConfig) -> None:
        self.config = config
        self.candidate = ""
        self.leading = False
        self.alive: set[str] = set()
        self.transitions = 0
        self._app: Istos | None = None
        self._token: Any = None
        self._watch: Any = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def _expr(self, app: Istos) -> str:
        return f"{app.node.prefix}/ha/{self.config.name}"

    async def start(self, app: Istos) -> None:
        self._app = app
        transport = app.node.transport
        assert transport is not None
        stamp = int(app.node.clock.now() * 1e6)
        self.candidate = f"{stamp:020d}-{app.node_id}"
        self._task = asyncio.get_running_loop().create_task(self._follow(app))
        self._watch = await transport.watch_liveliness(f"{self._expr(app)}/*", self._on_token)
        self._token = await transport.declare_liveliness_token(
            f"{self._expr(app)}/{self.candidate}")

    def _on_token(self, key: str, alive: bool) -> None:
        candidate = key.rsplit("/", 1)[-1]
        if alive:
            self.alive.add(candidate)
        else:
            self.alive.discard(candidate)
        self._changed.set()

    def leader(self) -> str | None:
        return min(self.alive) if self.alive else None

    async def _follow(self, app: Istos) -> None:
        """Apply leadership changes one at a time, in order (start and stop both await I/O)."""
        while True:
            await self._changed.wait()
            self._changed.clear()
            should_lead = self.leader() == self.candidate
            if should_lead and not self.leading:
                try:
                    await app._start_owner(self.config)
                except Exception:
                    log.exception("queue %s: taking over failed; retrying", self.config.name)
                    await app._stop_owner(self.config.name)
                    await app.node.clock.sleep(0.2)
                    self._changed.set()
                    continue
                self.leading = True
                self.transitions += 1
                log.info("queue %s: %s leads", self.config.name, self.candidate)
            elif not should_lead and self.leading:
                self.leading = False
                self.transitions += 1
                await app._stop_owner(self.config.name)
                log.info("queue %s: %s stands by", self.config.name, self.candidate)

    async def stop(self, app: Istos) -> None:
        for handle in (self._token, self._watch):
            if handle is not None:
                handle.close()
        self._token = self._watch = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.leading:
            self.leading = False
            await app._stop_owner(self.config.name)
