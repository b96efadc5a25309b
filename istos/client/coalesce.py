"""Coalesced remote enqueues: the ``enqueue`` calls one producer makes to a remote owner within
one event-loop turn go out as one ``enqueue_many`` request (after the turn's first call).

Linger zero: a call made while no other call of this client is open goes out at once, as a
plain ``enqueue``, and schedules nothing (a lone call pays nothing, not even a loop callback);
the calls that follow it while it waits for its reply join a batch sent at the end of their
turn (``call_soon``, scheduled by the first of them), and nothing waits for a reply before
sending. Each caller still gets its own answer: the reply's
``created`` flags are handed out per item, and an owner that refuses a batch as a whole for one
item (``InvalidJob``) or does not know ``enqueue_many`` (``ProtocolError``) stored nothing of
it, so its items are sent again one by one. A failure of the request itself
(``StorageUnavailable``: nothing of it was stored; ``OwnerUnavailable``) is every one of its
callers' failure, as it would have been for each call alone.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..errors import InvalidJob, IstosError, ProtocolError
from . import batches

Pending = tuple[dict[str, Any], "asyncio.Future[dict[str, Any]]"]


class Coalescer:
    def __init__(self, client: batches.Caller) -> None:
        self._client = client
        self._open: list[Pending] | None = None  # a lone call is out: later calls join this
        self._tasks: set[asyncio.Task[None]] = set()  # strong references while they run

    async def enqueue(self, fields: dict[str, Any]) -> dict[str, Any]:
        """One enqueue (``fields`` as the ``enqueue`` op reads them, with a job id); returns
        its reply (``job_id``, ``created``) or raises its error."""
        if self._open is None:
            # A lone call goes out at once, exactly as an uncoalesced call would, and
            # schedules nothing; the calls made while it is out join a batch.
            mine: list[Pending] = []
            self._open = mine
            try:
                return await self._client.call("enqueue", **fields)
            finally:
                if self._open is mine and not mine:
                    self._open = None  # nobody joined: the next call goes out at once too
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        if not self._open:  # the first to join: its turn's end sends the batch
            loop.call_soon(self._flush)
        self._open.append((fields, fut))
        return await fut

    def _flush(self) -> None:
        batch, self._open = self._open or [], None
        if not batch:
            return
        loop = asyncio.get_running_loop()
        for start, end in batches.cut([batches.item_size(f) for f, _ in batch]):
            task = loop.create_task(self._send(batch[start:end]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, chunk: list[Pending]) -> None:
        if len(chunk) == 1:
            fields, fut = chunk[0]
            try:
                _resolve(fut, await self._client.call("enqueue", **fields))
            except Exception as exc:  # noqa: BLE001 - the caller's to see, whatever it is
                _fail(fut, exc)
            return
        try:
            reply = await self._client.call("enqueue_many", items=[f for f, _ in chunk])
        except (InvalidJob, ProtocolError):
            # Refused whole, nothing stored: one by one, so only the bad item's caller fails.
            await asyncio.gather(*(self._send([one]) for one in chunk))
            return
        except Exception as exc:  # noqa: BLE001 - every caller's to see
            for _, fut in chunk:
                _fail(fut, exc)
            return
        for (fields, fut), created in zip(chunk, reply["created"]):
            _resolve(fut, {"job_id": fields["job_id"], "created": created})


def _resolve(fut: asyncio.Future[dict[str, Any]], reply: dict[str, Any]) -> None:
    if not fut.done():  # a caller that was cancelled no longer waits
        fut.set_result(reply)


def _fail(fut: asyncio.Future[dict[str, Any]], exc: Exception) -> None:
    if not fut.done():
        # Each caller its own instance of a typed error (their tracebacks would pile up).
        fut.set_exception(type(exc)(str(exc)) if isinstance(exc, IstosError) else exc)
