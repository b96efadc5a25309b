"""A blocking query over a Zenoh session: the :class:`~istos.SyncProducer`'s transport.

The calling thread waits on Zenoh's reply channel and no event loop takes part, so a request
costs one thread wake-up instead of the two loop hops of :class:`~istos.transport.zenoh.
ZenohTransport`. Its ``query`` is a coroutine that never suspends: the client's async request
code (:mod:`istos.client`) runs on it driven to its end within the calling thread
(:func:`istos.client.blocking.run_to_end`). The session is thread-safe; so is this.
"""

from __future__ import annotations

import threading

import zenoh
from zenoh.handlers import Callback

from ..errors import ConfigError, MeshUnreachable
from .base import NoResponder, TransportError


def open_session(config: zenoh.Config, who: str) -> zenoh.Session:
    """Open a session (blocking); MeshUnreachable when no router at its connect endpoints
    answered, ConfigError for anything else Zenoh refused."""
    try:
        return zenoh.open(config)
    except zenoh.ZError as exc:
        if "unable to connect" in str(exc).lower():
            raise MeshUnreachable(f"the {who} reached no Zenoh router at its connect "
                                  f"endpoints: {exc}") from exc
        raise ConfigError(f"zenoh could not open a session with this config: {exc}") from exc


class BlockingQuerier:
    """The ``query`` of the Transport port over ``session``, blocking the calling thread."""

    def __init__(self, session: zenoh.Session) -> None:
        self.session = session

    async def query(self, key: str, payload: bytes, timeout_s: float) -> bytes:
        """The first OK reply to ``payload`` on ``key`` (blocks; never suspends). Raises
        NoResponder when none came within ``timeout_s`` (nobody serves the key yet, or it
        answered too late), TransportError on an error reply or a failed query."""
        error: str | None = None
        try:
            replies = self.session.get(key, payload=payload, timeout=timeout_s,
                                       consolidation=zenoh.ConsolidationMode.NONE)
            for reply in replies:  # blocks this thread only, until a reply or the end
                ok = reply.ok
                if ok is not None:
                    return ok.payload.to_bytes()
                err = reply.err
                error = err.payload.to_bytes().decode("utf-8", "replace") if err else "?"
        except zenoh.ZError as exc:
            raise TransportError(f"query on {key!r} failed: {exc}") from exc
        if error is not None:
            raise TransportError(f"the owner answered with an error: {error}")
        raise NoResponder(f"no queryable answered on {key!r}")


class SentQuery:
    """One query sent without waiting (:meth:`BlockingQuerier.send`): its first OK reply, or
    how it ended, read later with :meth:`done`, :meth:`wait` and :meth:`outcome`. Zenoh's
    callbacks only record (they run on Zenoh's thread); every decision is the caller's."""

    __slots__ = ("_ok", "_error", "_ended")

    def __init__(self) -> None:
        self._ok: bytes | None = None
        self._error: str | None = None
        self._ended = threading.Event()

    def on_reply(self, reply: zenoh.Reply) -> None:  # Zenoh's thread
        ok = reply.ok
        if ok is not None:
            if self._ok is None:
                self._ok = ok.payload.to_bytes()
                self._ended.set()  # the first OK reply is the answer: stop waiting at once
            return
        err = reply.err
        self._error = err.payload.to_bytes().decode("utf-8", "replace") if err else "?"

    def on_done(self) -> None:  # Zenoh's thread
        self._ended.set()

    def done(self) -> bool:
        """Whether the query has its answer or has ended."""
        return self._ended.is_set()

    def wait(self, timeout_s: float) -> bool:
        """Block the calling thread until :meth:`done` or ``timeout_s``; whether done."""
        return self._ended.wait(max(0.0, timeout_s))

    def outcome(self) -> bytes:
        """The first OK reply's bytes, once :meth:`done`. Raises TransportError for an error
        reply and NoResponder when it ended with no reply (nobody served the key in time)."""
        if self._ok is not None:
            return self._ok
        if self._error is not None:
            raise TransportError(f"the owner answered with an error: {self._error}")
        raise NoResponder("no queryable answered")

    def fail(self, error: str) -> None:
        """End it with ``error`` (the get could not be sent)."""
        self._error = error
        self._ended.set()


def send_query(session: zenoh.Session, key: str, payload: bytes, timeout_s: float) -> SentQuery:
    """Send ``payload`` to ``key`` without waiting: the :class:`SentQuery` to read its answer
    from. Never raises (a get Zenoh refuses ends the query with its error)."""
    sent = SentQuery()
    try:
        session.get(key, Callback(sent.on_reply, sent.on_done, indirect=False),
                    payload=payload, timeout=timeout_s,
                    consolidation=zenoh.ConsolidationMode.NONE)
    except zenoh.ZError as exc:
        sent.fail(f"query on {key!r} failed: {exc}")
    return sent
