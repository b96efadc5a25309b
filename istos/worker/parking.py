"""The worker's side of parked claims (the owner's side and the why:
``owner/extensions/parking.py``).

One concept at three layers: parked claims' worker side here, the owner's side in
``owner/extensions/parking.py``, the request's in ``client/parking.py``.

A dispatcher with every slot it may fill still empty asks its claim to park at a remote owner,
up to its poll interval, and claims again as soon as a parked claim comes back: the parked
claim is the wait, and the nudge message is not needed. An owner that did not park the claim
(no ``parked`` in its reply) leaves the dispatcher to the nudge and the poll interval, as
before; one that stopped while the claim was parked (``unparked``) is asked again at once.

Stopping: a parked claim in flight is ended with ``unpark`` (the client's side,
:mod:`istos.client.parking`), so no job is leased to a worker that no longer listens. Dying:
the node's worker token (:func:`declare_worker_tokens`) goes with its session, and the owner
ends its parked claims.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .. import protocol
from ..client import OwnerClient
from ..client.parking import claim_timeout, unpark_until_back
from ..errors import IstosError
from ..node import Node
from ..transport.base import Handle

log = logging.getLogger("istos.worker")

AFTER_UNPARKED_S = 0.05  # the pause before claiming again from a queue whose owner stopped
AFTER_FAILED_S = 0.25  # ... after a parked claim failed (the owner went away, or its storage)


class ClaimParking:
    """When one dispatcher parks its claims, and how it ends a parked claim on stop."""

    def __init__(self, node: Node, client: OwnerClient, poll_s: float, enabled: bool) -> None:
        self.node, self.client = node, client
        self.enabled = enabled
        self.poll_s = min(poll_s, protocol.MAX_PARK_S)
        self.in_flight: list[str] | None = None  # the slots of the parked claim being sent
        # The secret that proves a parked claim is this dispatcher's (to supersede or unpark
        # it): from the node's id source, sent only with its own claims and unparks.
        self.key = node.ids.token()
        self.outcome = ""  # of the last claim: "parked", "unparked" or "" (not parked)
        # The owner answered a claim that asked to park with nothing and without parking it
        # (durable storage, an owner without parking, a full table): wait for its nudges
        # until a claim parks again.
        self.declined = False

    def park_s(self) -> float:
        """How long the next claim may park: 0 (do not) for an owner in this process, which
        nudges its workers directly."""
        if not self.enabled or self.client.owner_is_local():
            return 0.0
        return self.poll_s

    def begin(self, slots: list[str], park_s: float) -> float | None:
        """A claim is being sent; returns its request timeout (the park plus the usual)."""
        if park_s <= 0:
            return None
        self.in_flight = slots
        return claim_timeout(self.client, park_s)

    def end(self, reply: dict[str, Any] | None) -> None:
        """The claim came back (``reply``) or failed (None)."""
        parked, self.in_flight = self.in_flight, None
        if parked is not None and reply is not None:
            if reply.get("parked"):
                self.declined = False
            elif not reply.get("jobs") and not reply.get("unparked"):
                self.declined = True
        if reply is None:
            # A parked claim that failed most likely lost its owner: look again soon for
            # whoever owns the queue now rather than after a whole poll interval.
            self.outcome = "failed" if parked is not None else ""
        elif reply.get("unparked"):
            self.outcome = "unparked"
        else:
            self.outcome = "parked" if reply.get("parked") else ""

    def wait_after_short_claim(self, poll_s: float, *, holding: bool) -> float | None:
        """After a claim that left slots empty: None to claim again at once (the claim waited
        at the owner, and the worker holds no job), else the longest to wait for a wake-up.

        A worker that still holds jobs waits for the nudge (as without parking) or for the
        moment it holds none (:meth:`park_again`): its next parked claim then carries those
        jobs' acks, instead of a settle request of their own."""
        if self.outcome == "parked":
            return poll_s if holding else None
        if self.outcome == "unparked":
            return min(poll_s, AFTER_UNPARKED_S)
        return min(poll_s, AFTER_FAILED_S) if self.outcome == "failed" else poll_s

    def park_again(self, idle: bool) -> bool:
        """A job ended; whether to wake the dispatcher (it now holds none, and parks).

        Also after a claim that brought jobs (not parked, as a busy worker's claims are): the
        idle worker parks at once rather than wait for the next job's nudge, which would cost
        the next job two more messages (nudge, claim) than a parked claim's one, unless the
        owner declined to park its last empty claim."""
        if not idle:
            return False
        if self.outcome == "parked":
            return True
        return self.outcome == "" and not self.declined and self.park_s() > 0

    async def stop(self, dispatcher: asyncio.Task[None], budget_s: float) -> None:
        """End the parked claim ``dispatcher`` may be waiting on, and let it come back (at most
        ``budget_s``): jobs its reply brings are then run or released, never left leased.
        An owner that does not answer the unpark holds no parked claim to end (it is gone)."""
        await unpark_until_back(self.client, lambda: self.in_flight, self.node.node_id,
                                self.key, dispatcher, budget_s)


async def declare_worker_tokens(node: Node, queues: set[str]) -> list[Handle]:
    """One liveliness token per queue whose workers on ``node`` park their claims, held while
    the node serves: when the process dies its session ends and the token with it, which tells
    the owner to end that node's parked claims (``owner/extensions/parking.py``). A token that
    cannot be declared (an odd key) only loses that protection: the worker serves on."""
    handles: list[Handle] = []
    if node.transport is None:
        return handles
    for queue in sorted(queues):
        try:
            handles.append(await node.transport.declare_liveliness_token(
                node.worker_token_key(queue, node.node_id)))
        except IstosError as exc:
            log.warning("queue %s: no worker token (a dead worker's parked claim will wait "
                        "to its bound): %s", queue, exc)
    return handles
