"""Bulk enqueue, the producer's side: a batch cut into requests under the frame cap.

:func:`frames` cuts a batch into ``enqueue_many`` requests that each stay under the frame cap
(by bytes, under :data:`~istos.protocol.PAGE_BUDGET`, and by count, at most
:data:`~istos.protocol.MAX_ENQUEUE_ITEMS`), and :func:`send_many` sends them one round trip
each. The owner stores each request's jobs in one write, all or none
(:mod:`istos.owner.handlers.bulk`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from .. import protocol
from ..errors import IstosError


class Caller(Protocol):
    """What sending a batch needs of the client (:class:`~istos.client.OwnerClient`)."""

    async def call(self, op: str, timeout_s: float | None = None,
                   **fields: Any) -> dict[str, Any]: ...

ITEM_OVERHEAD = 96  # msgpack bytes of one item's map besides its body and job id (at most)


def item_size(item: dict[str, Any]) -> int:
    """An upper bound of one item's encoded bytes in an ``enqueue_many`` request."""
    meta = item.get("meta")  # a trace context (istos.tracing), if any
    size = len(item["body"]) + 4 * len(item["job_id"]) + ITEM_OVERHEAD \
        + 4 * len(item.get("group") or "") + (protocol.encoded_size(meta) if meta else 0) \
        + 24 * len(item.keys() & _DEADLINES)
    unique = item.get("unique")
    return size if unique is None else size + 4 * len(unique["key"]) + ITEM_OVERHEAD


_DEADLINES = frozenset(("expires_s", "start_by"))


def cut(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """``(start, end)`` of each request of a batch of items of these sizes, in order: each
    under the byte budget and the count cap (an item alone always fits: a body is at most
    MAX_BODY_BYTES)."""
    out: list[tuple[int, int]] = []
    start, used = 0, 0
    for i, size in enumerate(sizes):
        if i > start and (used + size > protocol.PAGE_BUDGET
                          or i - start >= protocol.MAX_ENQUEUE_ITEMS):
            out.append((start, i))
            start, used = i, 0
        used += size
    if start < len(sizes):
        out.append((start, len(sizes)))
    return out


def enqueue_item(job_id: str, body: bytes, delay_s: float = 0, priority: int = 0,
                 dedup_s: float | None = None, group: str | None = None,
                 meta: dict[str, Any] | None = None,
                 every: dict[str, Any] | None = None) -> dict[str, Any]:
    """One job as an ``enqueue_many`` request carries it, its options already checked: only
    the fields that differ from the owner's defaults (a zero delay or priority, no window,
    group or meta are left out, so the common item stays small); ``every``: fields added as
    they are (a start deadline)."""
    item: dict[str, Any] = {"body": body, "job_id": job_id}
    if delay_s:
        item["delay_s"] = delay_s
    if priority:
        item["priority"] = priority
    if dedup_s:
        item["dedup_s"] = dedup_s
    if group is not None:
        item["group"] = group
    if meta:
        item["meta"] = meta
    if every:
        item.update(every)
    return item


def spans(items: Sequence[dict[str, Any]]) -> list[tuple[int, int]]:
    """``(start, end)`` of each request that carries these items, in order (:func:`cut` of
    their :func:`item_size`)."""
    return cut([item_size(i) for i in items])


def frames(job_ids: Sequence[str], bodies: Sequence[bytes], delay_s: float, priority: int,
           dedup_s: float | None = None, groups: Sequence[str | None] | None = None,
           meta: dict[str, Any] | None = None,
           every: dict[str, Any] | None = None) -> list[list[dict[str, Any]]]:
    """The ``items`` of each request of a batch, in order (see :func:`cut`); ``meta``: the
    trace context every item carries (None: none); ``every``: fields each item carries (a
    start deadline)."""
    items = [enqueue_item(jid, body, delay_s, priority, dedup_s,
                          None if groups is None else groups[i], meta, every)
             for i, (jid, body) in enumerate(zip(job_ids, bodies))]
    return [items[a:b] for a, b in spans(items)]


async def send_many(client: Caller,  # noqa: PLR0913 - enqueue_many's options, passed on
                    job_ids: list[str], bodies: list[bytes],
                    delay_s: float, priority: int, timeout_s: float | None,
                    dedup_s: float | None = None,
                    groups: Sequence[str | None] | None = None,
                    meta: dict[str, Any] | None = None,
                    every: dict[str, Any] | None = None) -> list[str]:
    """Send a checked batch, one request per frame, in order; returns ``job_ids`` (``meta``:
    the trace context every item carries, or None; ``every``: fields each item carries).

    A failure after the first frame leaves the frames before it stored: the error says how
    many jobs, and sending the batch again with the same ids adds only the rest.
    """
    await send_frames(client, frames(job_ids, bodies, delay_s, priority, dedup_s, groups,
                                     meta, every), timeout_s)
    return job_ids


async def send_frames(client: Caller, requests: list[list[dict[str, Any]]],
                      timeout_s: float | None) -> list[str]:
    """Send the ``items`` of each request in order (as :func:`send_many`); returns the id
    each item resolved to (its own, or with a unique key the job holding that key)."""
    stored, total = 0, sum(map(len, requests))
    out: list[str] = []
    for items in requests:
        try:
            reply = await client.call("enqueue_many", timeout_s, items=items)
        except IstosError as exc:
            if not stored:
                raise
            raise type(exc)(f"{exc} (the first {stored} of {total} jobs were stored by "
                            "earlier requests; enqueue the batch again with the same job_ids "
                            "to add the rest)") from exc
        stored += len(items)
        resolved = reply.get("job_ids")
        if isinstance(resolved, list) and len(resolved) == len(items):
            out.extend(str(j) for j in resolved)
        else:
            out.extend(i["job_id"] for i in items)
    return out
