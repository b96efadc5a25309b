"""A blocking query over a Zenoh session: the :class:`~istos.SyncProducer`'s transport.

The calling thread waits on Zenoh's reply channel and no event loop takes part, so a request
costs one thread wake-up instead of the two loop hops of :class:`~istos.transport.zenoh.
ZenohTransport`. Its ``query`` is a coroutine that never suspends: the client's async request
code (:mod:`istos.client`) runs on it driven to its end within the calling thread
(:func:`istos.client.blocking.run_to_end`). The session is thread-safe; so is this.
"""

from __future__ import annotations

import zenoh

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
