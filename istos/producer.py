"""The producer's calls: put jobs on queues and ask about them (``Istos.enqueue`` and friends).

A component the app owns (``app.producer``), reached through thin delegating methods on
:class:`~istos.Istos`. Every argument is checked here, before anything is sent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol

from . import codec, protocol
from .client import OwnerClient, batches
from .client.deps import watch_parents
from .clock import Clock
from .core import deps
from .core.config import (
    check_dedup,
    check_delay,
    check_group,
    check_priority,
    check_queue_name,
)
from .core.expiry import check_deadline
from .core.trace_meta import without_trace
from .errors import ConfigError, InvalidJob, PayloadCodecError, ProtocolError
from .ids import IdSource
from .lifecycle import (
    UNSET,
    Enqueued,
    check_debounce,
    check_unique,
    check_unique_keys,
    check_update,
)
from .payload import CodecChain, Encoded, describe
from .protocol import MAX_PRIORITY
from .tracing import Tracing


class HasIds(Protocol):
    """What the producer needs of its node: the id source of the jobs it enqueues, and its
    clock (a ``start_by`` is checked against its wall time)."""

    @property
    def ids(self) -> IdSource: ...

    @property
    def clock(self) -> Clock: ...


class Producer:
    """Requests to queues' owners on behalf of one app (its node, clients and serving state);
    the :class:`~istos.SyncProducer` runs the same code."""

    def __init__(self, node: HasIds, client: Callable[[str], OwnerClient],
                 require_serving: Callable[[], None], *,
                 payload: CodecChain | None = None, tracing: Tracing | None = None) -> None:
        self.node = node
        self.payload = payload or CodecChain()  # bodies out, results and dead letters in
        self.tracing = tracing  # None: no spans, no trace context in the jobs
        self.client = client
        self.require_serving = require_serving
        self._valid_names: set[str] = set()  # queue names enqueue already checked

    async def enqueue(self, name: str, data: Any, *,  # noqa: PLR0913 (the public options)
                      delay_s: float = 0, priority: int = 0,
                      job_id: str | None = None, timeout_s: float | None = None,
                      dedup_s: float | None = None, group: str | None = None,
                      unique_key: str | None = None, unique: str | None = None,
                      unique_s: float | None = None, debounce_key: str | None = None,
                      debounce_s: float | None = None, debounce_max_s: float | None = None,
                      debounce: str | None = None,
                      expires_s: float | None = None, start_by: Any = None,
                      after: Iterable[Any] | None = None,
                      on_parent_failure: str = deps.DEFAULT_MODE,
                      _meta: dict[str, Any] | None = None) -> Enqueued:
        """Put a job on queue ``name``; returns its id (an :class:`~istos.Enqueued`, a ``str``
        that also says whether the job is new and, if not, why).

        Idempotent by ``job_id``: if the queue still holds that id, nothing is added and the id is
        returned. With ``dedup_s`` the id stays reserved that many seconds after the job
        finished (done, dead or cancelled): a resend inside the window returns the id and
        changes nothing, also across an owner restart or failover (``ConfigError`` without a
        ``job_id``). ``group``: the job's group (round-robin between groups, and the queue's
        ``group_concurrency``/``group_rate_limit`` per group). A start deadline,
        ``expires_s`` (seconds from when the owner accepts it) or ``start_by`` (a
        timezone-aware ``datetime``, or epoch seconds): a job no worker started by then ends
        ``expired``, never run nor dead-lettered (``result()`` says so). ``timeout_s`` overrides the
        app's ``request_timeout_s`` for this call. The returned id is stored by the owner
        (written through its storage) before this returns.

        ``unique_key`` (docs/job-lifecycle.md): while another job of the queue holds that key
        within its scope, nothing is added and that job's id is returned (``reason``
        ``"unique_key"``). ``unique``: the scope, ``"queued"`` (until the job is first
        claimed), ``"active"`` (until it is acked, dead or cancelled; the default) or
        ``"finished"`` (and for ``unique_s`` seconds after).

        ``debounce_key`` with ``debounce_s``: one run per burst of calls. While the burst's
        job has not started, a call with the key adds nothing (``reason``
        ``"debounce_key"``, the burst's id): the job takes this call's data (``debounce``
        ``"last"``, the default; ``"first"`` keeps the first) and starts ``debounce_s`` after
        it, never later than ``debounce_max_s`` after the burst's first call.

        Raises, before sending: :class:`ConfigError` for a bad queue name, ``delay_s``,
        ``priority``, ``job_id``, ``dedup_s``, ``group``, ``unique_key``, ``unique``,
        ``unique_s``, ``debounce_key``, ``debounce_s``, ``debounce_max_s`` or ``debounce``
        (a negative or non-finite window, a cap below ``debounce_s``, an unknown mode or
        scope, ``delay_s`` or a unique key with a debounce key), ``expires_s`` or
        ``start_by`` (both at once, not after ``delay_s``, a naive datetime);
        :class:`InvalidJob` for a body msgpack cannot encode, one over the size limit, or an
        id the wire refuses; and
        :class:`IstosError` when the app is not serving. After sending:
        :class:`OwnerUnavailable` if no owner answers within the request timeout,
        :class:`StorageUnavailable` if the owner's storage refused the write (nothing added),
        or the typed error the owner answered with (:class:`QueueNotFound`, ...).

        ``after``: the job's parents, each a ``(queue, job_id)`` pair or the
        :class:`~istos.Enqueued` an enqueue returned (docs/dependencies.md). The job is stored
        at once in state ``waiting`` and becomes ready (in its queue's order) once every
        parent is done. ``on_parent_failure``: what a parent that ends dead or cancelled does
        to it: ``"cancel"`` (the default: the job ends cancelled), ``"run"`` (it runs once
        every parent ended) or ``"wait"`` (it waits until an operator requeues the parent,
        promotes or cancels it). Raises, besides the above: :class:`ConfigError` for a
        malformed ``after`` (empty, over 64 parents, the job itself), a bad
        ``on_parent_failure``, or ``after`` with a unique key, a debounce key or a start
        deadline; :class:`JobNotFound` for a parent its queue does not hold; and
        :class:`~istos.ParentFailed` for a parent already dead or cancelled with
        ``"cancel"``. Nothing is enqueued then.

        To a remote owner, the calls made in one event-loop turn (``asyncio.gather`` of many
        enqueues) after its first travel as one ``enqueue_many`` request; the first (a lone
        call) goes out at once. Each call still returns its own id or raises its own error.
        """
        checked = name in self._valid_names  # a name is checked once, then remembered
        encoded = type(data) is Encoded  # composed by a chord's owner: sent as it is
        whole = encoded or self.payload.offloads  # (an offload codec takes larger bodies)
        body, delay, prio, window, grp = check_enqueue(
            name, None if whole else data, delay_s=delay_s, priority=priority,
            job_id=job_id, dedup_s=dedup_s, group=group, name_checked=checked)
        if not checked:
            self._valid_names.add(name)
        deadline = None if expires_s is None and start_by is None else \
            deadline_fields(expires_s, start_by, delay, self.node.clock.now())
        spec = None if unique_key is None and unique is None and unique_s is None \
            else check_unique(unique_key, unique, unique_s)
        burst = None if debounce_key is None and debounce_s is None \
            and debounce_max_s is None and debounce is None \
            else check_debounce(debounce_key, debounce_s, debounce_max_s, debounce,
                                delay_s=delay, unique=spec is not None)
        if encoded:
            body = bytes(data)
        elif whole:  # stores a large body now: a store failure raises, nothing sent
            body = self.payload.encode_body(data, queue=name)
        elif self.payload.codecs:
            body = self.payload.wrap(body, queue=name)
        parents = deps.check_after(name, job_id, after, on_parent_failure,
                                   alone=not (spec or burst or deadline or _meta))
        self.require_serving()
        # The id is chosen here, not by the owner, so a retried request cannot create a twin.
        jid = job_id or self.node.ids.new()
        if parents:  # watched first: a parent unknown or failed refuses the job
            _meta = await self._watch_parents(name, jid, parents, on_parent_failure, timeout_s)
        fields: dict[str, Any] = {"body": body, "job_id": jid, "delay_s": delay,
                                  "priority": prio}
        if window or grp is not None or deadline or _meta or spec or burst:
            _options(fields, window, grp, deadline, _meta, spec, burst)
        # Concurrent calls share one request, unless the reply must name a resolved job.
        coalesce = timeout_s is None and not _meta and spec is None and burst is None
        tracing = self.tracing
        if tracing is not None and (_meta or not tracing.idle()):
            return await tracing.enqueue(name, jid, 1, lambda trace: self._send(
                name, {**fields, "meta": {**(_meta or {}), "trace": trace}} if trace
                else fields, timeout_s, coalesce), parent=(_meta or {}).get("trace"))
        return await self._send(name, fields, timeout_s, coalesce)

    async def _watch_parents(self, name: str, jid: str, parents: list[tuple[str, str]],
                             mode: str, timeout_s: float | None) -> dict[str, Any]:
        """The ``deps`` meta of child ``jid`` once each parent's owner watches it for it."""
        return {deps.META: await watch_parents(self.client, name, jid, parents, mode,
                                               self.node.ids.token(), timeout_s)}

    async def _send(self, name: str, fields: dict[str, Any], timeout_s: float | None,
                    coalesce: bool) -> Enqueued:
        if coalesce:
            reply = await self.client(name).enqueue(fields)
        else:
            reply = await self.client(name).call("enqueue", timeout_s, **fields)
        return Enqueued.from_reply(reply, name)

    async def enqueue_many(self, name: str, items: Iterable[Any], *,  # noqa: PLR0913
                           delay_s: float = 0,
                           priority: int = 0, job_ids: Sequence[str] | None = None,
                           timeout_s: float | None = None,
                           dedup_s: float | None = None,
                           groups: Sequence[str | None] | None = None,
                           unique_keys: Sequence[str | None] | None = None,
                           unique: str | None = None,
                           unique_s: float | None = None,
                           expires_s: float | None = None, start_by: Any = None) -> list[str]:
        """Put many jobs on queue ``name``; returns their ids, in order.

        Sent as few requests as the frame cap allows (one round trip each), each stored by the
        owner in one write: all of a request's jobs, or none (:class:`StorageUnavailable`).
        Idempotent per item by ``job_ids`` (one per item; generated if None): sending a batch
        again adds only the ids the queue does not hold. Every item is checked before anything
        is sent: a body msgpack cannot encode or over the size limit, or a bad id, raises
        :class:`InvalidJob` naming the item, and nothing of the batch is sent. ``dedup_s``
        (with ``job_ids``): every item's id stays reserved that long after its job finished,
        as in :meth:`enqueue`. ``groups``: one group (or None) per item. ``unique_keys``: one
        unique key (or None) per item, with the batch's ``unique`` scope and ``unique_s``
        (as in :meth:`enqueue`); an item whose key another job holds (or an earlier item of
        the batch) adds nothing, and its entry in the returned list is that job's id.
        ``expires_s`` or ``start_by``: every item's start deadline, as in :meth:`enqueue`.

        Raises :class:`ConfigError` (nothing sent) for a bad option or when ``job_ids``,
        ``groups`` or ``unique_keys`` do not have one entry per item, :class:`IstosError`
        when the app is not serving, and :class:`OwnerUnavailable` or the owner's typed
        error for a request that failed: requests before it stay stored, and the message
        says how many jobs were.
        """
        datas = list(items)
        bodies, ids, delay, prio = check_batch(
            name, [None] * len(datas) if self.payload.offloads else datas, delay_s, priority,
            job_ids)
        window = check_dedup(dedup_s, job_ids is not None)
        grps = None if groups is None else list(groups)
        if grps is not None and len(grps) != len(bodies):
            raise ConfigError(f"groups has {len(grps)} entries for {len(bodies)} items")
        for i, g in enumerate(grps or ()):
            try:
                check_group(g)
            except ConfigError as exc:
                raise ConfigError(f"queue {name!r}: item {i}: {exc}") from None
        deadline = deadline_fields(expires_s, start_by, delay, self.node.clock.now())
        specs = check_unique_keys(bodies, unique_keys, unique, unique_s)
        if self.payload.offloads:  # large bodies go to the store now, before any is sent
            bodies = [self.payload.encode_body(d, queue=name) for d in datas]
        elif self.payload.codecs:
            bodies = [self.payload.wrap(b, queue=name) for b in bodies]
        self.require_serving()
        if ids is None:
            ids = [self.node.ids.new() for _ in bodies]
        if specs is None:
            if self.tracing is not None:
                ids_ = ids
                return await self.tracing.enqueue(name, None, len(ids), lambda trace: (
                    batches.send_many(self.client(name), ids_, bodies, delay, prio,
                                      timeout_s, window, grps,
                                      meta={"trace": trace} if trace else None,
                                      every=deadline)))
            return await batches.send_many(self.client(name), ids, bodies, delay, prio,
                                           timeout_s, window, grps, every=deadline)
        items = [i for frame in batches.frames(ids, bodies, delay, prio, window, grps,
                                               every=deadline) for i in frame]
        for item, spec in zip(items, specs):
            if spec is not None:
                item["unique"] = spec.to_wire()
        return await batches.send_frames(
            self.client(name), [items[a:b] for a, b in batches.spans(items)], timeout_s)

    async def dead_letters(self, name: str) -> list[dict[str, Any]]:
        """Every dead job of ``name``, oldest first, fetched page by page: dicts of
        ``job_id``, ``data`` (decoded), ``attempts``, ``last_error``, ``history`` (one entry per
        attempt), ``traceback`` (the latest attempt's, or None) and, for a workflow step,
        ``workflow``. Raises :class:`IstosError` when the app is not serving, and
        :class:`OwnerUnavailable` (or the owner's typed error) for a request that failed."""
        self.require_serving()
        page: list[dict[str, Any]] = []
        while True:  # the owner pages its answer (by count and bytes); fetch every page
            reply = await self.client(name).call("dead", offset=len(page), limit=1000)
            page.extend(reply["dead"])
            if not reply["dead"] or not reply.get("more", len(page) < reply.get("total", 0)):
                break
        return decode_dead(page, self.payload)

    async def job_logs(self, name: str, job_id: str) -> list[dict[str, Any]]:
        """Every ``ctx.log()`` line job ``job_id`` of queue ``name`` wrote, per kept attempt:
        ``[{"attempt", "logs", "logs_dropped"}]``, oldest first, read a page at a time (``why``
        and dead letters show as many as fit a reply and count the rest, ``logs_omitted``)."""
        self.require_serving()
        out: list[dict[str, Any]] = []
        after = 0
        while True:
            reply = await self.client(name).call("logs", job_id=job_id, after=after)
            out.extend(reply["attempts"])
            if not reply["more"] or not reply["attempts"]:
                return out
            after = reply["next_after"]

    async def result(self, name: str, job_id: str) -> dict[str, Any]:
        """Where job ``job_id`` of queue ``name`` stands: ``{"state", "result"}``, plus
        ``"error"`` (its last error) for a dead job.

        ``state`` is one of ``ready`` (waiting, also delayed), ``leased`` (running),
        ``done``, ``dead``, ``cancelled`` or ``unknown``. A queue declared with
        ``keep_results=True`` keeps a done job, and its ``result`` (the worker's decoded return
        value), for ``result_ttl_s``; without it a job is forgotten as soon as it is acked and
        reads ``unknown``, as does an id the queue never held. Raises
        :class:`IstosError` when the app is not serving, and :class:`OwnerUnavailable` (or the
        owner's typed error) for a request that failed.
        """
        self.require_serving()
        reply = await self.client(name).call("result", job_id=job_id)
        return decode_result(reply, self.payload)

    async def cancel(self, name: str, job_id: str) -> str:
        """Cancel job ``job_id`` of queue ``name`` (the queue needs ``admin=True``).

        Returns ``"cancelled"`` (it was waiting: now final, kept for ``result_ttl_s``),
        ``"cancelling"`` (it is running: its worker is told, stops it, and the job ends
        ``cancelled``, never retried nor dead-lettered), ``"too_late"`` (it already ended:
        done, dead, cancelled or expired; nothing changes) or ``"unknown"``. Raises
        :class:`AdminDisabled` without ``admin=True``, :class:`ConfigError` (nothing sent)
        for a bad queue name or ``job_id``, :class:`IstosError` when the app is not serving,
        and :class:`OwnerUnavailable` if no owner answers.
        """
        check_queue_name(name)
        if not isinstance(job_id, str) or not job_id:
            raise ConfigError(f"job_id must be a non-empty string, got {job_id!r}")
        self.require_serving()
        reply = await self.client(name).call("cancel", job_id=job_id)
        return str(reply["status"])

    async def update(self, name: str, job_id: str, *, data: Any = UNSET,
                     delay_s: float | None = None, run_at: float | datetime | None = None,
                     priority: int | None = None, timeout_s: float | None = None) -> str:
        """Edit job ``job_id`` of queue ``name`` while it waits (ready or delayed), in one
        durable write: its ``data``, its start (``delay_s`` from now, or ``run_at``, a
        datetime or epoch seconds; a time already past makes it ready at once) and/or its
        ``priority``. The producer's role may do it (no ``admin=True`` needed).

        Returns ``"updated"``, ``"too_late"`` (it started already: leased, done, dead or
        cancelled; nothing changed) or ``"unknown"`` (the queue holds no such job; a job of
        another queue is unknown here). Never half-applied: a failed write leaves the job as
        it was and raises :class:`StorageUnavailable`.

        Raises, before sending: :class:`ConfigError` naming the field for a bad queue name,
        ``job_id``, ``delay_s``, ``run_at`` or ``priority``, both ``delay_s`` and ``run_at``,
        or nothing to change; :class:`InvalidJob` for data msgpack cannot encode or over the
        size limit. After: :class:`OwnerUnavailable` or the owner's typed error.
        """
        fields = check_update(name, job_id, data, delay_s, run_at, priority)
        if "body" in fields and self.payload.codecs:
            fields["body"] = self.payload.wrap(fields["body"], queue=name)
        self.require_serving()
        reply = await self.client(name).call("update", timeout_s, job_id=job_id, **fields)
        return str(reply["status"])


# -- shared with the SyncProducer and the outbox ---------------------------------------------
def check_enqueue(name: str, data: Any, *, delay_s: float = 0, priority: int = 0,
                  job_id: str | None = None, dedup_s: float | None = None,
                  group: str | None = None, name_checked: bool = False
                  ) -> tuple[bytes, float, int, float | None, str | None]:
    """Every check :meth:`Producer.enqueue` makes, before anything is sent or written:
    ``(body, delay_s, priority, dedup_s, group)`` as the ``enqueue`` op carries them.

    Raises :class:`InvalidJob` for a body msgpack cannot encode, one over the size limit or an
    id the wire refuses, and :class:`ConfigError` for a bad name, delay, priority, window
    (``dedup_s`` without ``job_id``) or group. ``name_checked``: the caller already checked it.
    """
    if not name_checked:
        check_queue_name(name)
    body = codec.encode_body(data, queue=name)
    # The common case (no delay, an in-range int priority) skips the general checks.
    delay = 0.0 if delay_s == 0 and type(delay_s) is int else check_delay(delay_s)
    prio = priority if type(priority) is int and -MAX_PRIORITY <= priority <= MAX_PRIORITY \
        else check_priority(priority)
    if job_id is not None:
        check_job_id(name, job_id)
    window = None if dedup_s is None else check_dedup(dedup_s, job_id is not None)
    grp = None if group is None else check_group(group)
    return body, delay, prio, window, grp


def deadline_fields(expires_s: object, start_by: object, delay_s: float,
                    now: float) -> dict[str, float]:
    """The ``expires_s`` or ``start_by`` field an enqueue carries (none: {}); ConfigError
    naming the field for a bad one (:func:`istos.core.expiry.check_deadline`)."""
    exp, at = check_deadline(expires_s, start_by, delay_s, now)
    return {"expires_s": exp} if exp is not None else {"start_by": at} if at is not None \
        else {}


def check_job_id(name: str, job_id: object) -> None:
    """A caller's ``job_id`` for queue ``name``: ConfigError if no string, InvalidJob if the
    wire refuses it."""
    if not isinstance(job_id, str) or not job_id:
        raise ConfigError(f"job_id must be a non-empty string, got {job_id!r}")
    try:
        protocol.check_job_id("job_id", job_id)
    except ProtocolError as exc:
        raise InvalidJob(f"queue {name!r}: {exc}") from None


def check_batch(name: str, items: Iterable[Any], delay_s: float, priority: int,
                job_ids: Sequence[str] | None
                ) -> tuple[list[bytes], list[str] | None, float, int]:
    """Check every item of an ``enqueue_many`` before anything is sent: the bodies (encoded),
    the ids (None: to generate), the delay and the priority; raises naming the bad item."""
    check_queue_name(name)
    datas = list(items)
    delay, prio = check_delay(delay_s), check_priority(priority)
    ids = None if job_ids is None else list(job_ids)
    if ids is not None and len(ids) != len(datas):
        raise ConfigError(f"job_ids has {len(ids)} ids for {len(datas)} items")
    bodies = []
    for i, data in enumerate(datas):
        try:
            bodies.append(codec.encode_body(data, queue=name))
            if ids is not None:
                protocol.check_job_id(f"job_ids[{i}]", ids[i])
        except (InvalidJob, ProtocolError) as exc:
            raise InvalidJob(f"queue {name!r}: item {i}: {exc}") from None
    return bodies, ids, delay, prio


def decode_dead(page: list[dict[str, Any]], payload: CodecChain | None = None
                ) -> list[dict[str, Any]]:
    """Dead letters as the producer returns them (bodies decoded by ``payload``; a body it
    cannot decode has ``data`` None and ``encoded``, what it is encoded with)."""
    payload = payload or CodecChain()
    out = []
    for d in page:
        try:
            data, encoded = payload.decode_body(d["body"]), None
        except PayloadCodecError:
            data, encoded = None, describe(d["body"]) or "undecodable body"
        item = {"job_id": d["job_id"], "data": data,
                "attempts": d["attempts"], "last_error": d["last_error"],
                "history": d["history"],
                "traceback": protocol.latest_traceback(d["history"])}
        flow = without_trace(d.get("meta"))  # (a trace context is not a workflow)
        if flow:
            item["workflow"] = flow
        if encoded is not None:
            item["encoded"] = encoded
        out.append(item)
    return out


def decode_result(reply: dict[str, Any], payload: CodecChain | None = None) -> dict[str, Any]:
    """A ``result`` reply as the producer returns it (the result decoded by ``payload``;
    :class:`PayloadCodecError` when it cannot)."""
    raw = reply.get("result")
    decoded = None if raw is None else (payload or CodecChain()).decode_body(raw)
    out = {"state": reply["state"], "result": decoded}
    if reply.get("error") is not None:
        out["error"] = reply["error"]
    return out


def _options(fields: dict[str, Any], window: float | None, grp: str | None,
             deadline: dict[str, Any] | None, meta: dict[str, Any] | None,
             spec: Any, burst: Any) -> None:
    """Add an enqueue's optional fields to ``fields`` (only those given: the common request
    stays as small as it was)."""
    if window:
        fields["dedup_s"] = window
    if grp is not None:
        fields["group"] = grp
    if deadline:
        fields.update(deadline)
    if meta:
        fields["meta"] = meta
    if spec is not None:  # (alone: the reply names the job the key resolved to)
        fields["unique"] = spec.to_wire()
    if burst is not None:
        fields["debounce"] = burst.to_wire()
