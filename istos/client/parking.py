"""Parked claims, the client's side: how a claim asks to park, and how a parked claim ends.

One concept at three layers: parked claims' request side here, the worker's in
``worker/parking.py``, the owner's in ``owner/extensions/parking.py``.

A claim that carries ``park_s`` may wait at the owner up to that long for a job; its request
timeout is then the park plus the usual (:func:`claim_timeout`). Ending one (the worker stops)
is the ``unpark`` request, sent again every :data:`UNPARK_RETRY_S` until the claim came back,
since the unpark may overtake the claim it ends (:func:`unpark_until_back`). When to park and
what to do after is the worker's policy (``istos/worker/parking.py``); the owner's side is
``istos/owner/extensions/parking.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ..errors import IstosError
from .call import OwnerClient
from .timing import wait_at_most

log = logging.getLogger("istos.worker")

UNPARK_RETRY_S = 0.05
UNPARK_TIMEOUT_S = 2.0


def claim_timeout(client: OwnerClient, park_s: float) -> float | None:
    """The request timeout of a claim that may park ``park_s`` (None: the usual one)."""
    return park_s + client.node.request_timeout_s if park_s > 0 else None


async def unpark_until_back(client: OwnerClient, slots: Callable[[], list[str] | None],
                            node_id: str, park_key: str, back: asyncio.Future[Any],
                            budget_s: float) -> None:
    """End the parked claim of ``slots()`` (None once it came back; ``park_key`` the secret
    the claim parked with, which proves the unpark is the claimer's) and let it come back
    (``back`` done), at most ``budget_s`` on the client's clock. An owner that does not answer
    the unpark holds no parked claim to end (it is gone): the wait ends there."""
    clock = client.node.clock
    deadline = clock.monotonic() + budget_s
    while (parked := slots()) is not None and not back.done() \
            and clock.monotonic() < deadline:
        try:
            await client.call(
                "unpark", min(UNPARK_TIMEOUT_S, max(0.01, deadline - clock.monotonic())),
                workers=parked, node=node_id, park_key=park_key)
        except IstosError as exc:
            log.debug("unpark failed: %s", exc)
            return
        await wait_at_most(clock, UNPARK_RETRY_S, back)
