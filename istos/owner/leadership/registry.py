"""The owners running in this process, with the event loop each serves on.

A blocking caller cannot wait for a reply from an owner whose loop is the very thread it
blocks: the owner's share of the request would run only after the call gave up. The
:class:`~istos.SyncProducer` looks here first, and an owner found on the calling thread's own
running loop is asked in-process instead of over the mesh (see ``sync_producer.py``).

Written on owners' loop threads and read from any thread: entries are whole tuples in a dict
of lists replaced, never mutated in place, so a reader sees a consistent list.
"""

from __future__ import annotations

import asyncio

from ...node import LocalOwner

Entry = tuple[LocalOwner, asyncio.AbstractEventLoop]
_running: dict[tuple[str, str], list[Entry]] = {}


def add(owner: LocalOwner) -> None:
    """``owner`` serves from now on, on the running loop."""
    key = (owner.node.prefix, owner.name)
    entry = (owner, asyncio.get_running_loop())
    _running[key] = [e for e in _running.get(key, ()) if e[0] is not owner] + [entry]


def remove(owner: LocalOwner) -> None:
    key = (owner.node.prefix, owner.name)
    left = [e for e in _running.get(key, ()) if e[0] is not owner]
    if left:
        _running[key] = left
    else:
        _running.pop(key, None)


def on_this_loop(prefix: str, queue: str) -> LocalOwner | None:
    """The running owner of ``queue`` under ``prefix`` whose loop is the calling thread's
    running loop, or None (no loop runs on this thread, or no such owner on it)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    for owner, owner_loop in _running.get((prefix, queue), ()):
        if owner_loop is loop and owner.running:
            return owner
    return None
