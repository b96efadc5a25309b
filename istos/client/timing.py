"""Waits on the caller's Clock: the client's timers never read the loop's time directly."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from ..clock import Clock


async def wait_at_most(clock: Clock, seconds: float, what: Awaitable[Any]) -> bool:
    """Wait until ``what`` is done or ``seconds`` passed on ``clock``, whichever comes first;
    whether ``what`` is done. A coroutine ``what`` is cancelled if the time ran out first (a
    task or future is left alone: it belongs to someone else)."""
    target = asyncio.ensure_future(what)
    owned = target is not what
    sleeper = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait({target, sleeper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
        if owned and not target.done():
            target.cancel()
    return target.done()
