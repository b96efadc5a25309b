"""``LiveQueue.record(seconds)``: a live queue's recording as a replayable Trace.

One concept at three layers: the recording is ``istos/client/record.py``; the CLI writes it
as a file (``istos/ops/record.py``); this builds a Trace of it.

The recording is the engine's (:func:`istos.client.record.record`, the one ``istos record``
writes as a file): it runs on the LiveQueue's own loop thread with a follow stream of its own
(a follow the caller already runs is left alone), so a notebook cell that waits for it keeps its
kernel's loop running, as every LiveQueue call does. The Trace is built from it as
:meth:`Trace.load` builds one from the file.
"""

from __future__ import annotations

from collections.abc import Callable

from istos.client import OwnerClient
from istos.client.record import MAX_EVENTS as MAX_RECORD_EVENTS
from istos.client.record import check_seconds, record
from istos.transport.base import Transport

from ..data.trace import Trace

__all__ = ["record_on_loop", "check_seconds", "MAX_RECORD_EVENTS"]


async def record_on_loop(transport: Transport, client: OwnerClient, seconds: float,
                         bodies: bool, on_start: Callable[[], None] | None = None) -> Trace:
    """The recording (runs on the LiveQueue's loop thread); ``on_start()`` once the owner
    publishes to it."""
    rec = await record(transport, client, seconds, bodies=bodies, on_start=on_start)
    return Trace.from_recording(rec.header, rec.events, rec.bodies)
