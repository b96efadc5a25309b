"""Following a queue: an owner's live events that never go silent about what happened.

The one follower of ``istos follow``, ``istos record`` and ``istos_nb``'s ``LiveQueue.record``.

The follower subscribes to the owner's event key and keeps asking it to publish (the ``follow``
op) every :func:`renew_interval`; that renewal doubles as the owner's pulse. Besides events
(each with ``seq``: ``[epoch, n]``, see :mod:`istos.owner.persistence.sequence`) it yields markers,
dicts whose ``kind`` is

- ``owner_lost``: a renewal got no answer within the request timeout, so the follower knows
  within ~1.25 x that timeout; it keeps trying;
- ``owner_back``: an owner answers again (``restarted``: with a new epoch);
- ``gap``: events the follower did not see: ``missed`` how many (exact within one epoch; for
  an owner that restarted, the new owner's events its ring no longer holds), and
  ``lost_with_owner`` when the previous owner's last events died with it.

After a reconnect or a dropped batch it resumes from its last sequence number through the
owner's ring (``events_since``) before passing on newer live events, so markers always come
before the events that follow them, and no event is passed on twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from .. import codec, keys
from ..errors import IstosError, OwnerUnavailable, ProtocolError
from ..protocol import MAX_FOLLOW_TTL_S as FOLLOW_TTL_S
from ..transport.base import Transport
from .call import OwnerClient
from .timing import wait_at_most

Item = dict[str, Any]
MARKERS = frozenset({"owner_lost", "owner_back", "gap"})
MAX_RESUME_PAGES = 100


def renew_interval(timeout_s: float, ttl_s: float = FOLLOW_TTL_S) -> float:
    """How often the follower renews (and so checks the owner): a quarter of the timeout,
    at most a third of the follow's window ``ttl_s``."""
    return max(0.05, min(ttl_s / 3, timeout_s / 4))


class Follower:
    """One queue's event stream with markers, through ``client`` (requests) and ``transport``
    (the event subscription); iterate :meth:`items`. ``on_following()`` is called once the
    owner publishes to this follower (its first ``follow`` answered). ``ttl_s``: the follow
    window asked for (the owner's cap by default; every follower asking for the cap can never
    shorten another's window, as the owner keeps only the latest deadline).

    ``counts``: ``batches`` of events received live, ``bad`` undecodable ones, ``renewals``
    and ``renew_errors`` of the follow; ``granted_ttl_s`` the window the owner last granted,
    ``last_error`` what went wrong last."""

    def __init__(self, transport: Transport, client: OwnerClient,
                 on_following: Callable[[], None] | None = None,
                 ttl_s: float = FOLLOW_TTL_S) -> None:
        self.transport, self.client, self.queue = transport, client, client.queue
        self.on_following = on_following
        self.timeout_s = client.node.request_timeout_s
        self.ttl_s = self.granted_ttl_s = ttl_s
        self.counts = dict.fromkeys(("batches", "bad", "renewals", "renew_errors"), 0)
        self.last_error: str | None = None
        self.epoch: str | None = None
        self.last = 0
        self.up = False
        self._out: asyncio.Queue[Item] = asyncio.Queue()
        self._held: list[tuple[Any, Any, list[Any]]] = []  # live batches during a resume
        self._resuming = False
        self._resume_wanted = asyncio.Event()

    def _marker(self, kind: str, message: str, **fields: Any) -> None:
        self._out.put_nowait({"kind": kind, "queue": self.queue, "t": self.client.node.clock.now(),
                              "message": message, **fields})

    def _on_batch(self, _key: str, payload: bytes) -> None:
        try:
            msg = codec.decode_message(payload)
            events = msg.get("events")
            if not isinstance(events, list):
                raise ProtocolError("events is not a list")
        except Exception as exc:  # noqa: BLE001 - a malformed batch is skipped, not fatal
            self.counts["bad"] += 1
            self.last_error = f"undecodable event batch: {exc}"
            return
        self.counts["batches"] += 1
        batch = (msg.get("epoch"), msg.get("seqs"), events)
        if self._resuming:
            self._held.append(batch)
        else:
            self._accept(*batch)

    def _accept(self, epoch: Any, seqs: Any, events: list[Any]) -> None:
        if not isinstance(seqs, list) or len(seqs) != len(events) or epoch is None:
            for e in events:  # an owner that does not number its events: pass them on
                if isinstance(e, dict):
                    self._out.put_nowait(e)
            return
        if epoch != self.epoch:
            self._want_resume()  # a new owner: what it said before we heard it comes first
            self._held.append((epoch, seqs, events))
            return
        for n, e in zip(seqs, events):
            if not isinstance(n, int) or not isinstance(e, dict) or n <= self.last:
                continue  # seen already (a resume fetched it)
            if n > self.last + 1:  # the mesh dropped a batch: fetch the hole first
                self._want_resume()
                self._held.append((epoch, seqs, events))
                return
            self.last = n
            self._out.put_nowait({**e, "seq": [epoch, n]})

    def _want_resume(self) -> None:
        self._resuming = True
        self._resume_wanted.set()

    async def _position(self) -> None:
        """Where the owner's sequence is now: the stream starts after it."""
        reply = await self.client.call("events_since", epoch=None, after=0, limit=1)
        self.epoch, self.last = str(reply["epoch"]), int(reply["last"])

    async def _resume(self) -> None:
        """Fetch what came after our last event, then the live batches held meanwhile."""
        old_epoch = self.epoch
        fields: dict[str, Any] = {"epoch": self.epoch, "after": self.last}
        first = True
        for _ in range(MAX_RESUME_PAGES):
            reply = await self.client.call("events_since", **fields)
            epoch = str(reply["epoch"])
            if first:
                first = False
                self._report_gap(old_epoch, epoch, int(reply["missed"]))
                self.epoch = epoch
                if epoch != old_epoch:
                    self.last = 0
            for n, e in zip(reply["seqs"], reply["events"]):
                if n > self.last:
                    self.last = n
                    self._out.put_nowait({**e, "seq": [epoch, n]})
            if not reply.get("more"):
                break
            fields = {"epoch": epoch, "after": self.last}
        held, self._held = self._held, []
        self._resuming = False
        for batch in held:
            self._accept(*batch)

    def _report_gap(self, old: str | None, new: str, missed: int) -> None:
        if old != new:
            self._marker("gap", f"the owner of {self.queue!r} restarted (epoch {old} -> {new}): "
                         f"events its previous owner emitted after #{self.last} died with it; "
                         + (f"{missed} of the new owner's events are no longer kept"
                            if missed else "every event of the new owner follows"),
                         missed=missed, lost_with_owner=True, epoch=new,
                         after=[old, self.last])
        elif missed:
            self._marker("gap", f"{missed} event(s) of {self.queue!r} after #{self.last} were "
                         "missed (no longer in the owner's ring)", missed=missed,
                         lost_with_owner=False, epoch=new, after=[old, self.last])

    async def _follow(self) -> None:
        """Ask the owner to publish for ``ttl_s`` more; note the window it granted."""
        reply = await self.client.call("follow", ttl_s=self.ttl_s)
        self.granted_ttl_s = float(reply.get("ttl_s") or self.ttl_s)

    async def _renew_once(self) -> bool:
        try:
            await self._follow()
        except IstosError as exc:
            self.counts["renew_errors"] += 1
            self.last_error = f"follow renewal failed: {exc}"
            if not isinstance(exc, OwnerUnavailable):
                return False  # an answer, though not a grant: the owner is there
            if self.up:
                self.up = False
                self._marker("owner_lost", f"no answer from the owner of {self.queue!r} within "
                             f"{self.timeout_s:g} s: it may have died; still trying (last "
                             f"event #{self.last} of epoch {self.epoch})",
                             epoch=self.epoch, last_seq=self.last)
            return False
        self.counts["renewals"] += 1
        if not self.up:
            self.up = True
            self._marker("owner_back", f"the owner of {self.queue!r} answers again")
            self._want_resume()
        return True

    async def _watch(self) -> None:
        interval = renew_interval(self.timeout_s, self.ttl_s)
        clock = self.client.node.clock
        while True:
            started = clock.monotonic()
            await self._renew_once()
            if self.up and self._resume_wanted.is_set():
                self._resume_wanted.clear()
                try:
                    await self._resume()
                except OwnerUnavailable:
                    self._resume_wanted.set()  # the next renewal says what happened
            delay = interval - (clock.monotonic() - started)
            await wait_at_most(clock, max(0.0, delay), self._resume_wanted.wait())

    async def items(self) -> AsyncIterator[Item]:
        """Events and markers until the caller stops iterating. Raises OwnerUnavailable if
        no owner answers at the start (nothing to follow yet)."""
        handle = await self.transport.declare_subscriber(
            keys.events_key(self.client.node.prefix, self.queue), self._on_batch)
        watcher: asyncio.Task[None] | None = None
        try:
            await self._position()
            await self._follow()
            self.up = True
            if self.on_following is not None:
                self.on_following()
            watcher = asyncio.get_running_loop().create_task(self._watch())
            while True:
                yield await self._out.get()
        finally:
            if watcher is not None:
                watcher.cancel()
            handle.close()
