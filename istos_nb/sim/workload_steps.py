"""What the simulated workload's scenarios share (``batch_workload.py``, ``chord_workload.py``,
``chain_workload.py``): the world they record time from, and a step retried while no owner
answers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from istos.errors import IstosError

RETRIES = 40  # tries of each step before the scenario gives up
RETRY_MAX_S = 8.0  # the backoff's cap between tries, virtual seconds


class ScenarioWorld(Protocol):
    """What a scenario asks of the world it lives in (:class:`~istos_nb.sim.world.World`)."""

    def now(self) -> float: ...


async def retried(row: dict[str, Any], what: str, step: Callable[[], Awaitable[Any]],
                  want: Any = None) -> Any:
    """``await step()`` until it answers, backing off on virtual time: its answer (``want``
    instead when given), or None when it gave up, recorded in ``row["gave_up"]``."""
    delay = 0.25
    for _ in range(RETRIES):
        try:
            got = await step()
            return want if want is not None else got
        except IstosError:
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
    row["gave_up"] = what
    return None
