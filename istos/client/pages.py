"""Paged reads: the owner caps a page by count and by bytes; these fetch page after page.

Shared by the CLI's operator and ``istos_nb``'s ``LiveQueue`` (and a recording's body poll),
so a reply too large for one message is asked again smaller the same way everywhere.
"""

from __future__ import annotations

from typing import Any

from ..protocol import MAX_PAGE
from .call import OwnerClient, ReplyTooLarge


async def jobs_pages(client: OwnerClient, state: str | None, where: dict[str, Any],
                     want: int | None, offset: int, filters: dict[str, Any] | None = None,
                     notes: dict[str, int] | None = None
                     ) -> tuple[list[dict[str, Any]], bool, int | None]:
    """The ``jobs`` op's rows of ``state`` (None: all) matching ``where`` and ``filters``, from
    ``offset``, until ``want`` rows (None: every page) or none is left: ``(rows, more, total)``,
    ``more`` whether the owner holds more, ``total`` the owner's count if it said one.
    A page too large for one message is asked again at half the size. ``notes`` (if given)
    gets ``unsearched``: how many bodies encoded by payload codecs the ``where`` search met
    and could not look into."""
    rows: list[dict[str, Any]] = []
    size, more, total = MAX_PAGE, True, None
    while more and (want is None or len(rows) < want):
        page = size if want is None else min(size, want - len(rows))
        try:
            reply = await client.call("jobs", state=state, where=where,
                                      offset=offset + len(rows), limit=page, **(filters or {}))
        except ReplyTooLarge:
            if page == 1:  # cannot happen: one body (<= 1 MiB) fits in one message
                raise
            size = max(1, page // 2)  # big bodies: smaller pages
            continue
        got = reply["jobs"]
        rows.extend(got)
        if notes is not None and reply.get("unsearched"):
            notes["unsearched"] = notes.get("unsearched", 0) + int(reply["unsearched"])
        total = reply.get("total", total)
        more = bool(reply.get("more", len(got) >= page))
    return rows, more, total


async def dead_pages(client: OwnerClient, limit: int | None) -> list[dict[str, Any]]:
    """Dead letters, oldest first; every page unless ``limit`` caps them. A page too large
    for one message (big bodies and histories) is asked again at a quarter of the size."""
    dead: list[dict[str, Any]] = []
    size = MAX_PAGE
    while limit is None or len(dead) < limit:
        want = size if limit is None else min(size, limit - len(dead))
        try:
            reply = await client.call("dead", offset=len(dead), limit=want)
        except ReplyTooLarge:
            if want == 1:
                raise
            size = max(1, want // 4)
            continue
        dead.extend(reply["dead"])
        if not reply["dead"] or len(dead) >= reply.get("total", len(dead)):
            break
    return dead


async def workers_pages(client: OwnerClient) -> list[dict[str, Any]]:
    """The owner's table of workers seen lately, every page."""
    rows: list[dict[str, Any]] = []
    while True:
        reply = await client.call("workers", offset=len(rows))
        rows.extend(reply["workers"])
        if not reply.get("more") or not reply["workers"]:
            return rows


MAX_SERIES_PAGES = 1000  # a day of minutes or an hour of seconds is a handful of pages


async def series_pages(client: OwnerClient, since: float | None, resolution: str = "1s"
                       ) -> list[dict[str, Any]]:
    """Every page of the owner's series rows at ``resolution`` from ``since`` (None: all it
    keeps; a negative ``since`` reads as 0)."""
    rows: list[dict[str, Any]] = []
    fields: dict[str, Any] = {"resolution": resolution}
    if since is not None:
        fields["since"] = max(0.0, since)
    for _ in range(MAX_SERIES_PAGES):
        reply = await client.call("series", **fields)
        rows.extend(reply["rows"])
        if not reply.get("more") or reply.get("next_since") is None:
            break
        fields["since"] = float(reply["next_since"])
    return rows
