"""Rate-limited queues: wake the throttled workers when tokens come back.

A claim the rate limit cut (``core/ratelimit.py``) gets fewer jobs than slots, and its worker
sleeps until a nudge or its poll interval. Rather than nudging it at once (it would come back
to an empty bucket: a busy loop) the owner sets one timer for the moment the next token returns
and nudges the hungry workers then, as many as there are tokens. One timer per queue, however
many claims were throttled; none at all for a queue without a limit.
"""

from __future__ import annotations

import asyncio
import math

from ...core.records import READY
from ..handle import OwnerHandle


class RefillNudge:
    """The owner's timer for the next token of its queue's rate limit."""

    def __init__(self, owner: OwnerHandle) -> None:
        self.owner = owner
        self._handle: asyncio.TimerHandle | None = None
        self._at = math.inf

    def after_claim(self, now: float) -> None:
        """A rate limit (the queue's or a group's) cut a claim while jobs were ready: set the
        nudge for when a token returns (one timer: an earlier one already set is kept)."""
        at = self.owner.state.throttled_until(now)
        if at is None:
            return
        if self._handle is None or at < self._at:
            if self._handle is not None:
                self._handle.cancel()
            clock = self.owner.node.clock
            self._at = at
            self._handle = asyncio.get_running_loop().call_later(
                clock.to_loop_seconds(max(0.0, at - now)), self._fire)

    def _fire(self) -> None:
        self._handle, self._at = None, math.inf
        owner = self.owner
        if not owner.running:
            return
        state, now = owner.state, owner.node.clock.now()
        ready = state.counts[READY]
        if not ready:
            return
        limiter = state.limiter
        tokens = ready if limiter is None else limiter.available(now)
        if tokens <= 0:  # the clock stepped back: wait for the token again
            self.after_claim(now)
            return
        owner.nudge(min(tokens, ready))

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle, self._at = None, math.inf
