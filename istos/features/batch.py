"""Batches: open groups of jobs on any queues, with callbacks when they end.

``batch = await app.batch(on_success=(queue, data), ...)`` opens a batch at its *home* owner
(the ``home`` queue's owner, by default the queue of its first callback among ``on_complete``,
``on_success``, ``on_death``); ``await batch.add(queue, data, **enqueue_options)`` adds a member
on any queue; ``await batch.close()`` says no more members come from outside. A member's
handler may add more members (``ctx.batch.add``), also after close, while it runs. The home
owner keeps the counts through its storage and fires each callback once
(``owner/extensions/batches_ext.py``; the rules are in ``core/batch_state.py``).

Adding is two steps: the home counts the member as pending (``batch_add``), then the member is
enqueued on its queue with ``meta={"batch": {id, home, key}}``. Both are idempotent by the
member's job id, so an :meth:`Batch.add` that raised after the first step is repeated with the
same ``job_id`` (:class:`BatchAddFailed` carries it); until then the member counts as pending.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .. import codec, protocol
from ..core import batch_state as bs
from ..core.config import check_queue_name
from ..errors import ConfigError, IstosError, JobNotFound
from ..events import JobEvent
from ..owner.extensions.batches_ext import BatchOwner

if TYPE_CHECKING:
    from ..client import OwnerClient
    from ..node import Node
    from ..owner.handle import OwnerHandle

MAX_HOME_BYTES = 150  # a batch id holds its home's name, and callback ids hold the batch id


class BatchAddFailed(IstosError):
    """:meth:`Batch.add` counted the member at the batch's home but could not enqueue it: the
    member stays pending until ``add`` is called again with ``job_id=exc.job_id``."""

    def __init__(self, message: str, job_id: str) -> None:
        super().__init__(message)
        self.job_id = job_id


class Enqueue(Protocol):
    """The producer's ``enqueue``, as far as batches use it."""

    async def __call__(self, name: str, data: Any, *, delay_s: float = 0, priority: int = 0,
                       job_id: str | None = None, timeout_s: float | None = None,
                       dedup_s: float | None = None, group: str | None = None,
                       _meta: dict[str, Any] | None = None) -> str: ...


@dataclass
class Batch:
    """A handle on one batch: :meth:`add` members, :meth:`close` it, read its :meth:`status`.

    ``id`` is the batch id (``wf:<32 hex>@<home queue>``): safe to show and store, as it
    proves nothing; the handle also holds the batch's key, which adds and closes.
    """

    id: str
    home: str
    _key: str = field(repr=False)
    _batches: Batches = field(repr=False)
    _parent: str | None = field(default=None, repr=False)  # the member adding (ctx.batch)

    async def add(self, queue: str, data: Any, *, job_id: str | None = None,
                  **options: Any) -> str:
        """Add a member: ``data`` as a job on ``queue``; returns its job id.

        ``options`` are :meth:`~istos.Istos.enqueue`'s (``delay_s``, ``priority``,
        ``dedup_s``, ``group``, ``timeout_s``). Idempotent by ``job_id`` (generated if None).
        Raises :class:`InvalidJob` when the batch is closed (and this is not a running
        member's ``ctx.batch.add``) or unknown at its home, :class:`ConfigError` for a bad
        queue name or option (``after`` too: a member cannot wait for parents),
        :class:`OwnerUnavailable` when the home does not answer (nothing added), and
        :class:`BatchAddFailed` when the member was counted but its enqueue failed.
        """
        check_queue_name(queue)
        if "after" in options:  # (a member waiting for parents: not supported together)
            raise ConfigError("batch.add takes no after=: a member cannot wait for parents")
        b = self._batches
        jid = job_id or b.node.ids.new()
        codec.encode_body(data, queue=queue)  # refuse what cannot be encoded before counting
        entry = await self.count(queue, jid)
        try:
            return await b.enqueue(queue, data, job_id=jid, _meta={"batch": entry}, **options)
        except IstosError as exc:
            raise BatchAddFailed(f"batch {self.id}: member {jid!r} is counted but its enqueue "
                                 f"on {queue!r} failed ({type(exc).__name__}: {exc}); add it "
                                 f"again with job_id={jid!r}", jid) from exc

    async def count(self, queue: str, job_id: str) -> dict[str, Any]:
        """The first step of :meth:`add`: count job ``job_id`` of ``queue`` as a pending
        member at the home (idempotent by ``job_id``) without enqueueing it; returns the
        ``batch`` entry of meta the member's job must carry (``app.chord`` adds it to its
        members' chord meta). Raises as :meth:`add` before anything is counted."""
        fields: dict[str, Any] = {"batch_id": self.id, "key": self._key, "member": job_id,
                                  "member_queue": queue}
        if self._parent is not None:
            fields["parent"] = self._parent
        await self._batches.client(self.home).call("batch_add", **fields)
        return {"id": self.id, "home": self.home, "key": self._key}

    async def close(self) -> None:
        """No member joins from outside any more; callbacks fire once their condition holds.
        Idempotent. Raises :class:`OwnerUnavailable` when the home does not answer (call it
        again)."""
        await self._batches.client(self.home).call("batch_close", batch_id=self.id,
                                                   key=self._key)

    async def status(self) -> dict[str, Any]:
        """The batch's counts and callbacks (:meth:`Batches.batch_status`)."""
        return await self._batches.batch_status(self.id)

    async def batch(self, **options: Any) -> Batch:
        """Open a child batch that counts as one member of this one: as
        :meth:`Batches.batch` (``on_success``, ``on_complete``, ``on_death``, ``description``,
        ``home``; the home defaults to the first callback's queue, else this batch's home).

        Once the child is closed and no member of it is pending, it ends in this batch as a
        member would: ``done`` when every member of it is done, ``dead`` when one is dead,
        else ``cancelled``. The same rules as :meth:`add` apply (closed batches, and a running
        member's ``ctx.batch.batch`` also after close). Raises as :meth:`Batches.batch`, and
        as :meth:`add` when this batch refuses the child (the child is then open but counted
        nowhere: nothing waits for it)."""
        return await self._batches.batch(parent=self, **options)


class Batches:
    """``app.batch`` and ``app.batch_status``; :meth:`owner_extension` is the owner side."""

    def __init__(self, node: Node, enqueue: Enqueue, client: Callable[[str], OwnerClient],
                 require_serving: Callable[[], None]) -> None:
        self.node = node
        self.enqueue = enqueue
        self.client = client
        self._require_serving = require_serving
        self._owners: dict[str, BatchOwner] = {}
        node.events.subscribe(self._route, ROUTED)

    async def batch(self, *, on_success: tuple[str, Any] | None = None,
                    on_complete: tuple[str, Any] | None = None,
                    on_death: tuple[str, Any] | None = None, description: str = "",
                    home: str | None = None, parent: Batch | None = None) -> Batch:
        """Open a batch; add members with :meth:`Batch.add`, then :meth:`Batch.close` it.

        Each callback is ``(queue, data)``; its job's body is ``{"batch_id", "kind",
        "description", "total", "pending", "done", "dead", "cancelled", "input": data}``.
        After close, ``on_complete`` fires once no member is pending (each done, dead or
        cancelled), ``on_success`` once every member is done, ``on_death`` once a member is
        dead: each at most once. ``home``: the queue whose owner keeps the batch (default:
        the queue of ``on_complete``, else ``on_success``, else ``on_death``, else the
        parent's home). ``parent``: a batch this one is a member of (:meth:`Batch.batch`).

        Raises :class:`ConfigError` for a malformed callback, a bad queue name, no callback,
        no ``home`` and no ``parent``, or a description over 1024 bytes; :class:`InvalidJob`
        for callback data msgpack cannot encode (or a ``parent`` that refuses the child);
        :class:`OwnerUnavailable` when the home (or a callback queue's owner, which must
        expect the callback) does not answer.
        """
        self._require_serving()
        callbacks = _callbacks(on_complete=on_complete, on_success=on_success,
                               on_death=on_death)
        home = _home(home, callbacks, parent)
        if not isinstance(description, str) or \
                len(description.encode()) > protocol.MAX_BATCH_DESCRIPTION:
            raise ConfigError("description must be a string of at most "
                              f"{protocol.MAX_BATCH_DESCRIPTION} bytes")
        key = self.node.ids.token()
        bid = bs.batch_id(key, home)
        foreign: dict[str, list[str]] = {}
        for kind, (queue, _) in callbacks.items():
            if queue != home:
                foreign.setdefault(queue, []).append(kind)
        for queue, kinds in foreign.items():  # on its produce key: only who may enqueue there
            await self.client(queue).call("batch_reserve", batch_id=bid, key=key, kinds=kinds)
        fields: dict[str, Any] = {}
        if parent is not None:
            fields["parent_batch"] = {"id": parent.id, "home": parent.home, "key": parent._key}
        await self.client(home).call(
            "batch_open", batch_id=bid, key=key, description=description,
            callbacks={k: [q, b] for k, (q, b) in callbacks.items()}, **fields)
        if parent is not None:
            await self._join(parent, bid, home)
        return Batch(bid, home, key, self)

    async def _join(self, parent: Batch, bid: str, home: str) -> None:
        """Count child batch ``bid`` as one pending member of ``parent``, at its home."""
        joined: dict[str, Any] = {"batch_id": parent.id, "key": parent._key, "member": bid,
                                  "member_queue": home}
        if parent._parent is not None:  # a running member's ctx.batch: may add after close
            joined["parent"] = parent._parent
        await self.client(parent.home).call("batch_add", **joined)

    async def batch_status(self, batch_id: str) -> dict[str, Any]:
        """The batch's ``total``, ``pending``, ``done``, ``dead``, ``cancelled``, ``closed``,
        ``description``, ``created_at``, ``finished_at`` and ``callbacks`` (each kind's
        ``queue`` and ``fired_at``, None until it fired), read from its home owner.

        Raises :class:`ConfigError` for a string that is not a batch id,
        :class:`JobNotFound` when the home holds no such batch (never opened, or pruned a day
        after it finished), and :class:`OwnerUnavailable` when the home does not answer.
        """
        home = bs.home_of(batch_id)
        reply = await self.client(home).call("batch_status", batch_id=batch_id)
        if reply.get("batch") is None:
            raise JobNotFound(f"queue {home!r} holds no batch {batch_id!r}")
        return reply["batch"]  # type: ignore[no-any-return]

    def handle_for(self, meta: dict[str, Any] | None, job_id: str) -> Batch | None:
        """The batch a running member belongs to, as ``ctx.batch`` (adds as that member)."""
        entry = (meta or {}).get("batch")
        if not isinstance(entry, dict):
            return None
        return Batch(entry["id"], entry["home"], entry["key"], self, job_id)

    def owner_extension(self, owner: OwnerHandle) -> BatchOwner:
        """Serve batches on ``owner`` (home and member sides)."""

        async def call(queue: str, op: str, **fields: Any) -> dict[str, Any]:
            return await self.client(queue).call(op, **fields)

        ext = BatchOwner(owner, call, self.enqueue)
        self._owners[owner.name] = ext  # a restarted owner's extension replaces the old one
        return ext

    def _route(self, event: JobEvent) -> None:
        if event.kind not in ROUTED:
            return
        ext = self._owners.get(event.queue)
        if ext is not None and ext.owner.running:
            ext.on_event(event)


def _callbacks(**specs: tuple[str, Any] | None) -> dict[str, tuple[str, bytes]]:
    """``{kind: (queue, encoded data)}`` from ``app.batch``'s callback arguments (in order)."""
    callbacks: dict[str, tuple[str, bytes]] = {}
    for kind, spec in specs.items():
        if spec is None:
            continue
        if not isinstance(spec, (tuple, list)) or len(spec) != 2:
            raise ConfigError(f"{kind} must be a (queue, data) pair, got {spec!r}")
        queue = check_queue_name(spec[0])
        callbacks[kind] = (queue, codec.encode_body(spec[1], queue=queue))
    return callbacks


def _home(home: str | None, callbacks: dict[str, tuple[str, bytes]],
          parent: Batch | None) -> str:
    """The batch's home queue: ``home``, else the first callback's queue, else the parent's."""
    if parent is not None and not isinstance(parent, Batch):
        raise ConfigError(f"parent must be a Batch (app.batch's handle), got {parent!r}")
    if home is None:
        if callbacks:
            home = next(iter(callbacks.values()))[0]
        elif parent is not None:
            home = parent.home
        else:
            raise ConfigError("a batch needs a callback or a home queue (or a parent batch)")
    check_queue_name(home)
    if len(home.encode()) > MAX_HOME_BYTES:
        raise ConfigError(f"a batch's home queue name is at most {MAX_HOME_BYTES} bytes")
    return home


ROUTED = frozenset({"owner_up", "dead_lettered", "cancelled"})
