"""One call to a queue's owner: the request path every caller shares.

:class:`OwnerClient` sends one op to one queue's owner and returns its checked reply, or raises
the typed error the owner answered with (:func:`raise_for_reply`). When the caller's node itself
owns the queue (and is serving it: ``local_owner``), the call goes straight to the owner's
``dispatch``: same code path as a remote request minus the envelope, which is what makes an
in-process enqueue cost microseconds rather than a network round trip. A remote call goes to the
op's role key (:mod:`istos.keys`) through :func:`query_owner`, retried while nobody serves it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from .. import codec, errors, keys, protocol
from ..clock import Clock
from ..node import LocalOwner
from ..transport.base import NoResponder, TransportError, TransportTimeout
from .coalesce import Coalescer

_ERRORS = protocol.ERROR_CLASSES


class Querier(Protocol):
    """What the client needs of a transport: the Transport port's ``query``."""

    async def query(self, key: str, payload: bytes, timeout_s: float) -> bytes: ...


class Endpoint(Protocol):
    """What a client needs of the node it calls from (:class:`~istos.node.Node` has it all;
    callers without a node build a :class:`~istos.client.endpoint.Remote`)."""

    @property
    def transport(self) -> Querier | None: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def prefix(self) -> str: ...

    @property
    def request_timeout_s(self) -> float: ...

    @property
    def local_owner(self) -> Callable[[str], LocalOwner | None]:
        """The owner of a queue serving in this process, if any (its calls skip the mesh)."""


class ReplyTooLarge(errors.ProtocolError):
    """A reply above the codec's message cap; the caller asks again for fewer items."""


def raise_for_reply(reply: dict[str, Any], queue: str) -> dict[str, Any]:
    """``reply`` if it says ``ok``; else raise the typed error class its ``error`` names
    (:data:`istos.protocol.ERROR_CLASSES`; :class:`~istos.errors.RemoteError` for a name this
    side does not know), with the owner's message."""
    if reply.get("ok"):
        return reply
    cls = _ERRORS.get(str(reply.get("error")), errors.RemoteError)
    raise cls(f"queue {queue!r}: {reply.get('message') or reply.get('error')}")


FIRST_PAUSE_S = 0.01  # the first wait before asking an absent owner again (then doubled)
PARK_REPLY_ALLOWANCE_S = 0.25  # a parked claim's reply trip, beyond its park time


class OwnerClient:
    """Requests to one queue's owner from ``node``; coalesces a remote owner's enqueues."""

    def __init__(self, node: Endpoint, queue: str) -> None:
        self.node = node
        self.queue = queue
        self._key = keys.rpc_base(node.prefix, queue)  # each op goes to its role's key below it
        self._coalescer: Coalescer | None = None

    async def call(self, op: str, timeout_s: float | None = None, **fields: Any) -> dict[str, Any]:
        """Send ``op`` to the queue's owner; raise the typed error it answered with.

        Raises :class:`OwnerUnavailable` when no owner answers within ``timeout_s`` (default: the
        node's ``request_timeout_s``), and :class:`ReplyTooLarge` (a ``ProtocolError``) for a
        reply above the message cap.
        """
        msg = {"v": protocol.VERSION, "op": op, **fields}
        owner = self.node.local_owner(self.queue)
        if owner is not None and owner.running:
            # In-process: the app built these fields from values it checked itself.
            return raise_for_reply(await owner.dispatch(msg, trusted=True), self.queue)
        return raise_for_reply(await self._remote(msg, timeout_s), self.queue)

    def owner_is_local(self) -> bool:
        """Whether the queue's owner runs in this process (requests then skip the mesh)."""
        owner = self.node.local_owner(self.queue)
        return owner is not None and owner.running

    async def enqueue(self, fields: dict[str, Any]) -> dict[str, Any]:
        """The ``enqueue`` op with ``fields`` (a job id included); to a remote owner coalesced
        with this event-loop turn's other enqueues into one request (see :mod:`.coalesce`)."""
        owner = self.node.local_owner(self.queue)
        if owner is not None and owner.running:
            return await self.call("enqueue", **fields)
        if self._coalescer is None:
            self._coalescer = Coalescer(self)
        return await self._coalescer.enqueue(fields)

    async def _remote(self, msg: dict[str, Any], timeout_s: float | None) -> dict[str, Any]:
        transport = self.node.transport
        if transport is None:
            raise errors.IstosError("this app is not serving: use `async with app.serving():`")
        budget = self.node.request_timeout_s if timeout_s is None else timeout_s
        op = msg["op"]
        # A parked claim needs its park time left when it reaches an owner found late: the
        # owner would otherwise lease a job after this request gave up (its reply unheard).
        park = msg.get("park_s")
        reserve = float(park) + PARK_REPLY_ALLOWANCE_S if isinstance(park, (int, float)) \
            and park > 0 else 0.0
        raw = await query_owner(transport, keys.op_key(self._key, op), self.queue,
                                codec.encode_message(msg), budget, clock=self.node.clock,
                                what=f"{op} request", where=f" (prefix {self.node.prefix!r})",
                                reserve_s=reserve)
        if len(raw) > codec.MAX_MESSAGE_BYTES:
            raise ReplyTooLarge(f"queue {self.queue!r}: the {op} reply is {len(raw)} bytes, "
                                f"above the {codec.MAX_MESSAGE_BYTES} message cap")
        return codec.decode_message(raw)


async def query_owner(transport: Querier, key: str, queue: str, payload: bytes,  # noqa: PLR0913
                      budget_s: float, *, clock: Clock, what: str = "owner request",
                      where: str = "", reserve_s: float = 0.0) -> bytes:
    """``payload`` to ``key``, retried while nobody serves it, until ``budget_s`` has passed on
    ``clock`` (the caller's: a simulated node's skew and drift apply); the first reply's bytes.
    A retry is sent only while more than ``reserve_s`` of the budget is left (the time the
    request needs at the owner, e.g. a parked claim's).

    Raises :class:`OwnerUnavailable` when no owner answered in time or the transport failed.
    """
    deadline = clock.monotonic() + budget_s
    pause = FIRST_PAUSE_S
    while True:
        remaining = deadline - clock.monotonic()
        if remaining <= 0 or (remaining <= reserve_s and pause > FIRST_PAUSE_S):
            break
        try:
            return await transport.query(key, payload, clock.to_loop_seconds(remaining))
        except NoResponder:
            # Right after start-up the owner may not be discovered yet: retry until the
            # deadline, backing off so an absent owner costs a few queries per second.
            await clock.sleep(min(pause, max(0.0, deadline - clock.monotonic())))
            pause = min(pause * 2, 0.25)
            continue
        except TransportTimeout:
            break
        except TransportError as exc:
            raise errors.OwnerUnavailable(f"queue {queue!r}: {what} failed: {exc}") from exc
    raise errors.OwnerUnavailable(
        f"no owner of queue {queue!r}{where} answered within {budget_s:g} s "
        f"(is a node serving app.queue({queue!r}) reachable on the mesh?)")
