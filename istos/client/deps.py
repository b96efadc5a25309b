"""The producer's half of ``enqueue(..., after=[...])``: watch each parent, then enqueue.

Before the child is sent, each parent's owner is asked to watch the parent for it
(``dep_watch``, with the child's queue, id and capability key): the owner stores the watch
(durably, so its restart loses no report) and answers the parent's state now. A parent that
already ended is resolved at once, one its queue does not hold is refused, and (with
``on_parent_failure="cancel"``) one already dead or cancelled refuses the enqueue. The child
carries what was learned in its meta (``core/deps.py``); its owner asks each parent still
pending again once the child is stored (a parent that ended between the two is then found),
so no end is lost whatever the order.

Dependencies are one concept at three layers: the rules (``core/deps.py``), this client
half, and the app's wiring (``features/deps.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..core import deps
from ..errors import JobNotFound, ParentFailed
from .call import OwnerClient


async def watch_parents(client: Callable[[str], OwnerClient], queue: str, job_id: str,
                        parents: list[tuple[str, str]], mode: str, key: str,
                        timeout_s: float | None = None) -> dict[str, Any]:
    """Watch ``parents`` for child ``job_id`` on ``queue``; returns the child's ``deps`` meta
    entry (each parent's outcome as its owner answered).

    Raises :class:`JobNotFound` for a parent its queue does not hold (never enqueued, or
    ended and forgotten), :class:`ParentFailed` for a parent already dead or cancelled when
    ``mode`` is ``"cancel"``, and :class:`OwnerUnavailable` (or the owner's typed error) when
    a parent's owner does not answer. Nothing is enqueued then; a watch already stored for
    another parent only ever reports to a child that does not exist (ignored).
    """
    async def ask(parent: tuple[str, str]) -> str:
        reply = await client(parent[0]).call("dep_watch", timeout_s, job_id=parent[1],
                                             child_queue=queue, child_id=job_id, key=key)
        return str(reply["state"])

    if _in_a_loop():
        states = await asyncio.gather(*(ask(p) for p in parents))
    else:  # the blocking client drives this coroutine itself, with no event loop to gather on
        states = [await ask(p) for p in parents]
    outcomes = []
    for parent, state in zip(parents, states):
        if state == "unknown":
            raise JobNotFound(f"after: queue {parent[0]!r} holds no job {parent[1]!r} (never "
                              "enqueued, or it ended and was forgotten: see docs/dependencies)")
        if state in deps.FAILED and mode == "cancel":
            raise ParentFailed(f"after: parent {parent[1]!r} on queue {parent[0]!r} already "
                               f"ended {state} (on_parent_failure='cancel'): nothing enqueued",
                               parent, state)
        outcomes.append(state if state in deps.OUTCOMES else deps.PENDING)
    return {"after": [list(p) for p in parents], "o": outcomes, "mode": mode, "key": key}


def _in_a_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True
