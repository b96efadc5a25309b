"""Shared test helpers: apps on the in-process mesh, and waiting on owner events with a bound
(never on wall-clock sleeps)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from istos import Istos, JobEvent
from istos.transport.local import LocalMesh


def app_on(mesh: LocalMesh, name: str, **kw: Any) -> Istos:
    """An app on ``mesh`` as node ``name`` (not started); ``kw`` go to :class:`Istos`."""
    return Istos(transport=mesh.transport(name), **kw)


async def wait_events(app: Istos, pred: Callable[[list[JobEvent]], bool],
                      timeout_s: float = 5.0) -> list[JobEvent]:
    """Wait until ``pred(all events so far)`` holds for the app's event log; return them."""
    seen: list[JobEvent] = list(app.events.recent())
    changed = asyncio.Event()

    def listener(event: JobEvent) -> None:
        seen.append(event)
        changed.set()

    async def until() -> None:
        while not pred(seen):
            changed.clear()
            await changed.wait()

    unsubscribe = app.events.subscribe(listener)
    try:
        await asyncio.wait_for(until(), timeout_s)
    finally:
        unsubscribe()
    return seen


def count(events: list[JobEvent], kind: str, job_id: str | None = None) -> int:
    return sum(1 for e in events if e.kind == kind and (job_id is None or e.job_id == job_id))


def extend_owners(app: Istos, *extensions: Any, first: bool = False) -> None:
    """Add ``extensions`` (:class:`~istos.owner.extension.OwnerExtension`) to every queue owner
    ``app`` sets up from now on, after the app's own setup (``first``: their hooks run first)."""
    original = app._setup_owner

    def setup(queue_owner: Any) -> None:
        original(queue_owner)
        for ext in (reversed(extensions) if first else extensions):  # keep their order
            queue_owner.extend(ext, first=first)

    app._setup_owner = setup  # type: ignore[method-assign]
