"""The wire protocol of a queue's owner, in one place (docs/protocol.md describes it in words).

Op names, the limits and caps, one request schema per op, and the shape of every reply. The
owner validates each request against its op's schema *before* its handler runs, so nothing a
malformed request carries ever reaches the queue's state; the client side imports the same
limits to refuse bad input before sending. A rejection is always the typed error map::

    {"v": 1, "ok": False, "error": <IstosError subclass name>, "message": <text>}

Checks validate, they never coerce: ``"5"`` is not a priority, ``True`` and ``1.0`` are not a
version, a list is not a job id. Unknown extra fields are ignored (version 1 may grow optional
fields, see docs/protocol.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import msgpack

from . import codec, errors
from .core.trace_meta import TRACE_KEY, check_trace, trace_only
from .errors import InvalidJob, IstosError, ProtocolError
from .schema import (
    Field,
    binary,
    check_fields,
    fail,
    identifier,
    integer,
    list_of,
    nesting,
    number,
    one_of,
    text,
)
from .wire_lifecycle import debounce_field, unique_field

T = TypeVar("T")

VERSION = codec.PROTOCOL_VERSION
MAX_BODY_BYTES = codec.MAX_BODY_BYTES  # a job body or an ack's result
FRAME_CAP = codec.MAX_MESSAGE_BYTES  # no message, request or reply, is larger
ENVELOPE_RESERVE = 16 << 10  # room a reply keeps for everything but its list of items
PAGE_BUDGET = FRAME_CAP - ENVELOPE_RESERVE  # bytes of items one reply may carry

MAX_JOB_ID_BYTES = 200  # a job id is a storage key too (the SQL adapter's column is 255)
MAX_TOKEN_BYTES = 64
MAX_SLOT_ID_BYTES = 256  # worker slot ids and node ids
MAX_SLOTS = 1024  # worker slots in one claim
MAX_SETTLE_ITEMS = 4096  # acks/nacks in one request
MAX_RELEASES = 4096  # jobs handed back unrun in one release request
MAX_ERROR_BYTES = 1024  # a nack's error text is kept up to this many bytes (cut, not refused)
MAX_TRACEBACK_BYTES = 8 << 10  # a failed attempt's traceback as kept (the innermost frames)
MAX_RESULT_SHOWN = 4 << 10  # bytes of a kept result that `why` shows (bigger: size only)
MAX_LOGS_SHOWN = 256 << 10  # bytes of ctx.log() lines one `why` or dead letter shows
MAX_META_BYTES = 16 << 10
MAX_META_DEPTH = 16
MAX_WHERE_KEYS = 16
MAX_WHERE_PATH_BYTES = 256
MAX_WHERE_PATH_PARTS = 16
MAX_WHERE_VALUE_DEPTH = 8
MAX_PRIORITY = (1 << 31) - 1  # priorities are in [-MAX_PRIORITY, MAX_PRIORITY]
MAX_DELAY_S = 10 * 365 * 86_400.0
MAX_GROUP_BYTES = 128  # a job's group name (enqueue ``group``), UTF-8 bytes
MAX_PAUSE_REASON_BYTES = 500  # why a queue or group is paused (pause ``reason``)
MAX_PAUSE_BY_BYTES = 200  # who paused it, as the caller names itself (pause ``by``)
MAX_PAUSED_GROUPS = 1000  # groups of one queue paused at once (CapacityExceeded past it)
MAX_LOG_LINES = 100  # ctx.log() lines per attempt (core/joblogs.py)
MAX_LOG_LINE_BYTES = 1024
MAX_OFFSET = 1 << 31
MAX_PAGE = 1000  # jobs, dead and leases pages
MAX_EVENTS = 5000  # events per reply
MAX_FOLLOW_TTL_S = 30.0
MAX_ID_LIST = 4096  # job ids in one purge_dead
MAX_BULK = 1000  # jobs one bulk admin request changes (requeue_all_dead, promote, ...)
MAX_SEARCH_TEXT = 1024  # an error or worker substring a `jobs` search looks for
MAX_TIME = 1e11  # epoch seconds a time range may name (year 5138)
MAX_PARK_S = 60.0  # the longest a claim may wait at the owner for a job (parked claims)

SETTLE_OPS = ("ack", "nack")
JOB_STATES = ("ready", "delayed", "leased", "done", "dead", "cancelled", "expired", "waiting")
MAX_EXTEND_ITEMS = 1024  # leases renewed by one heartbeat request
MAX_ENQUEUE_ITEMS = 4096  # jobs in one enqueue_many request (and bytes: under PAGE_BUDGET)
_TOKEN = re.compile(r"[0-9A-Za-z._:-]+")
RESERVED_ID_PREFIXES = ("wf:", "sched:")
"""Job ids only workflows (``wf:``, proven by their key) and schedules (``sched:``, through
``enqueue_slot``) create; a plain ``enqueue`` or ``enqueue_many`` of one is ``InvalidJob``."""

check_job_id = identifier(MAX_JOB_ID_BYTES)
check_slot_id = identifier(MAX_SLOT_ID_BYTES)


def token(name: str, value: Any) -> None:
    if type(value) is str and 0 < len(value) <= MAX_TOKEN_BYTES and value.isascii() \
            and value.isalnum():
        return  # the owner's tokens are hex
    if type(value) is not str or not 0 < len(value) <= MAX_TOKEN_BYTES \
            or _TOKEN.fullmatch(value) is None:
        fail(name, f"must be a lease token (1-{MAX_TOKEN_BYTES} characters of [0-9A-Za-z._:-])",
              value)


def meta(name: str, value: Any) -> None:
    """Generic bounds of a job's ``meta``; its workflow shape is checked by the workflow code."""
    if value is None:
        return
    if type(value) is not dict:
        fail(name, "must be a map or nil", value)
    try:  # the size first: encoding in C is cheaper than walking a big map in Python
        size = encoded_size(value)
    except (TypeError, ValueError, OverflowError) as exc:  # msgpack's own depth limit, too
        raise ProtocolError(f"{name} cannot be encoded: {exc}") from None
    if size > MAX_META_BYTES:
        raise ProtocolError(f"{name} is {size} bytes encoded; the limit is {MAX_META_BYTES}")
    try:
        nesting(value, MAX_META_DEPTH)
    except ProtocolError as exc:
        raise ProtocolError(f"{name} {exc}") from None
    if TRACE_KEY in value:  # a traced producer's W3C context (core/trace_meta.py)
        check_trace(f"{name}.{TRACE_KEY}", value[TRACE_KEY])


def where(name: str, value: Any) -> None:
    if value is None:
        return
    if type(value) is not dict:
        fail(name, "must be a map of dotted paths to values", value)
    if len(value) > MAX_WHERE_KEYS:
        raise ProtocolError(f"{name} has {len(value)} keys; the limit is {MAX_WHERE_KEYS}")
    for path, expected in value.items():
        text(MAX_WHERE_PATH_BYTES, empty=False)(f"{name} path", path)
        if path.count(".") >= MAX_WHERE_PATH_PARTS:
            raise ProtocolError(f"{name} path {path[:40]!r}... has more than "
                                f"{MAX_WHERE_PATH_PARTS} parts")
        try:
            nesting(expected, MAX_WHERE_VALUE_DEPTH)
        except ProtocolError as exc:
            raise ProtocolError(f"{name} value of {path!r} {exc}") from None


_LOG_FIELDS = (  # an attempt's ctx.log() lines, riding on a settle or an extend item
    Field("logs", list_of(text(MAX_LOG_LINE_BYTES), MAX_LOG_LINES, nil=True)),
    Field("logs_dropped", integer(0, (1 << 31) - 1)),
    Field("logs_at", integer(0, (1 << 31) - 1)),  # the first line's index in the attempt's
)

_SETTLE_ITEM = (
    Field("op", one_of(*SETTLE_OPS, nil=False), required=True),
    Field("job_id", check_job_id, required=True),
    Field("token", token, required=True),
    Field("result", binary(MAX_BODY_BYTES, nil=True)),
    Field("error", text(1 << 20, nil=True)),  # longer than MAX_ERROR_BYTES is cut, not refused
    Field("traceback", text(1 << 20, nil=True)),  # cut to MAX_TRACEBACK_BYTES, not refused
    # A nack's chosen wait (istos.Retry); nil is no choice, as when absent.
    Field("retry_after", number(0.0, MAX_DELAY_S, nil=True)),
    *_LOG_FIELDS,
)


def settle_item(name: str, value: Any) -> None:
    if type(value) is not dict:
        fail(name, "must be a map {op, job_id, token, result?, error?, traceback?}", value)
    check_fields(value, _SETTLE_ITEM, prefix=f"{name}.")


_LEASE_ITEM = (
    Field("job_id", check_job_id, required=True),
    Field("token", token, required=True),
)


def lease_item(name: str, value: Any) -> None:
    """A ``release`` item: ``{job_id, token}``."""
    if type(value) is not dict:
        fail(name, "must be a map {job_id, token, ...}", value)
    check_fields(value, _LEASE_ITEM, prefix=f"{name}.")


_EXTEND_ITEM = (*_LEASE_ITEM, *_LOG_FIELDS)


def extend_item(name: str, value: Any) -> None:
    """An ``extend`` item: ``{job_id, token, logs?, logs_at?, logs_dropped?}`` as in
    ``settle``; its progress and note are checked by the op itself, which answers
    ``InvalidProgress``."""
    if type(value) is not dict:
        fail(name, "must be a map {job_id, token, ...}", value)
    check_fields(value, _EXTEND_ITEM, prefix=f"{name}.")


_SLOT_LIST = list_of(check_slot_id, MAX_SLOTS, empty=False)


def slot_list(name: str, value: Any) -> None:
    """A claim's ``workers``: 1-1024 slot ids, each listed once (at most one job per slot: a
    repeated slot would lease several jobs to one slot, which runs one at a time)."""
    _SLOT_LIST(name, value)
    if len(set(value)) != len(value):
        seen: set[str] = set()
        for slot in value:
            if slot in seen:
                fail(name, "must list each slot once; repeated", slot)
            seen.add(slot)


_ENQUEUE_ITEM = (
    Field("body", binary(MAX_BODY_BYTES), required=True),
    Field("job_id", check_job_id, required=True),  # producer-chosen: a retried batch is a no-op
    Field("delay_s", number(0.0, MAX_DELAY_S)),
    Field("priority", integer(-MAX_PRIORITY, MAX_PRIORITY)),
    # The id stays reserved this long after the job ended; the job's round-robin/concurrency
    # group (nil for either: none, as when absent).
    Field("dedup_s", number(0.0, MAX_DELAY_S, nil=True)),
    Field("group", text(MAX_GROUP_BYTES, empty=False, nil=True)),
    # A start deadline (core/expiry.py): seconds from acceptance, or epoch seconds; not both.
    Field("expires_s", number(0.0, MAX_DELAY_S, nil=True)),
    Field("start_by", number(0.0, MAX_TIME, nil=True)),
    Field("unique", unique_field),  # its unique key (wire_lifecycle.py)
)


def enqueue_item(name: str, value: Any) -> None:
    """One job of an ``enqueue_many``: ``{body, job_id, delay_s?, priority?, meta?}`` (a
    ``meta`` holds a trace context only: workflow jobs go one by one)."""
    if type(value) is not dict:
        fail(name, "must be a map {body, job_id, delay_s?, priority?}", value)
    if "meta" in value:  # workflow jobs go one by one (enqueue), where meta is checked
        if not trace_only(value["meta"]):
            raise ProtocolError(f"{name}.meta: enqueue_many carries no job meta but a trace "
                                "context")
        meta(f"{name}.meta", value["meta"])
    if "debounce" in value:  # a burst's calls change one job: one by one (enqueue)
        raise ProtocolError(f"{name}.debounce: enqueue_many carries no debounce key")
    check_fields(value, _ENQUEUE_ITEM, prefix=f"{name}.")
    one_deadline(value, f"{name}.")
    if value["job_id"].startswith(RESERVED_ID_PREFIXES):
        raise InvalidJob(f"{name}.job_id {value['job_id'][:60]!r}: ids starting with 'wf:' or "
                         "'sched:' are made by workflows and schedules only")


def one_deadline(msg: dict[str, Any], prefix: str = "") -> None:
    """Refuse an enqueue (or item) with both ``expires_s`` and ``start_by``: InvalidJob."""
    if msg.get("expires_s") is not None and msg.get("start_by") is not None:
        raise InvalidJob(f"{prefix}expires_s and {prefix}start_by: give one start deadline, "
                         "not both")


def slot_job_id(name: str, value: Any) -> None:
    """An ``enqueue_slot`` id: a job id in the schedules' namespace, ``sched:{name}:{slot}``."""
    check_job_id(name, value)
    if not value.startswith("sched:") or value.count(":") < 2:
        fail(name, "must be a schedule slot id 'sched:{name}:{slot}'", value)


MIN_ID_PREFIX = 6  # shorter prefixes match too much to name a job
MAX_RESOLVE_MATCHES = 10


def id_prefix(name: str, value: Any) -> None:
    """The start of a job id, at least :data:`MIN_ID_PREFIX` characters (``resolve``)."""
    check_job_id(name, value)
    if len(value) < MIN_ID_PREFIX:
        fail(name, f"must be at least {MIN_ID_PREFIX} characters", value)


# -- the schemas --------------------------------------------------------------------------------
_JOB_ID = Field("job_id", check_job_id, required=True)
_OFFSET = Field("offset", integer(0, MAX_OFFSET))
_PAGE = Field("limit", integer(1, 1 << 31))  # larger than the op's cap means the cap

SCHEMAS: dict[str, tuple[Field, ...]] = {
    "ping": (),
    "enqueue": (
        Field("body", binary(MAX_BODY_BYTES), required=True, error=InvalidJob),
        Field("job_id", check_job_id, error=InvalidJob),  # the owner picks one if absent
        Field("delay_s", number(0.0, MAX_DELAY_S), error=InvalidJob),
        Field("priority", integer(-MAX_PRIORITY, MAX_PRIORITY), error=InvalidJob),
        Field("meta", meta, error=InvalidJob),
        Field("dedup_s", number(0.0, MAX_DELAY_S, nil=True), error=InvalidJob),
        Field("group", text(MAX_GROUP_BYTES, empty=False, nil=True), error=InvalidJob),
        Field("expires_s", number(0.0, MAX_DELAY_S, nil=True), error=InvalidJob),
        Field("start_by", number(0.0, MAX_TIME, nil=True), error=InvalidJob),
        Field("unique", unique_field, error=InvalidJob),  # its unique key (wire_lifecycle.py)
        Field("debounce", debounce_field, error=InvalidJob),  # its burst (wire_lifecycle.py)
    ),
    "enqueue_many": (
        Field("items", list_of(enqueue_item, MAX_ENQUEUE_ITEMS), required=True, error=InvalidJob),
    ),
    "claim": (
        Field("workers", slot_list, required=True),
        Field("node", text(MAX_SLOT_ID_BYTES)),
        Field("settle", list_of(settle_item, MAX_SETTLE_ITEMS, nil=True)),
        Field("park_s", number(0.0, MAX_PARK_S)),  # wait for a job up to this long if none
        Field("park_key", token),  # the worker's secret that proves its parked claim
    ),
    "unpark": (
        Field("workers", list_of(check_slot_id, MAX_SLOTS, empty=False), required=True),
        Field("node", text(MAX_SLOT_ID_BYTES)),
        Field("park_key", token),
    ),
    "settle": (Field("items", list_of(settle_item, MAX_SETTLE_ITEMS), required=True),),
    "ack": (_JOB_ID, Field("token", token, required=True),
            Field("result", binary(MAX_BODY_BYTES, nil=True))),
    "nack": (_JOB_ID, Field("token", token, required=True),
             Field("error", text(1 << 20, nil=True)),
             Field("traceback", text(1 << 20, nil=True)),
             Field("retry_after", number(0.0, MAX_DELAY_S, nil=True))),
    "result": (_JOB_ID,),
    "dead": (_OFFSET, _PAGE),
    "requeue_dead": (_JOB_ID,),
    "chord_open": (
        Field("chord_id", check_job_id, required=True),
        Field("size", integer(1, 1 << 20), required=True),
        Field("callback", text(MAX_JOB_ID_BYTES, empty=False), required=True),
        Field("key", text(64, empty=False), required=True),
    ),
    "chord_expects": (Field("chord_id", check_job_id, required=True),),
    "chord_reserve": (
        Field("chord_id", check_job_id, required=True),
        Field("member_queue", text(MAX_JOB_ID_BYTES, empty=False), required=True),
        Field("size", integer(0, 1 << 20), required=True),
        Field("key", text(64, empty=False), required=True),
    ),
    "stats": (),
    "jobs": (Field("state", one_of(*JOB_STATES)), Field("where", where), _OFFSET, _PAGE,
             Field("error", text(MAX_SEARCH_TEXT, empty=False, nil=True)),
             Field("worker", text(MAX_SEARCH_TEXT, empty=False, nil=True)),
             *(Field(f"{what}_{end}", number(0.0, MAX_TIME))
               for what in ("enqueued", "finished") for end in ("after", "before"))),
    "workers": (_OFFSET, _PAGE),
    "states": (Field("job_ids", list_of(check_job_id, MAX_PAGE), required=True),),
    "requeue_all_dead": (Field("error", text(MAX_SEARCH_TEXT, empty=False, nil=True)),
                         Field("limit", integer(1, MAX_BULK))),
    "promote": (Field("job_ids", list_of(check_job_id, MAX_BULK, nil=True)),
                Field("limit", integer(1, MAX_BULK))),
    "purge_dead_older": (Field("older_than_s", number(0.0, MAX_TIME), required=True),
                         Field("limit", integer(1, MAX_BULK))),
    "leases": (_OFFSET, _PAGE),
    "why": (_JOB_ID,),
    "logs": (_JOB_ID, Field("after", integer(0, MAX_OFFSET))),
    "events": (_PAGE,),
    "follow": (Field("ttl_s", number(0.0, 1e9)),),
    "requeue": (_JOB_ID,),
    "purge_dead": (Field("job_ids", list_of(check_job_id, MAX_ID_LIST, nil=True)),),
    "pause": (Field("reason", text(MAX_PAUSE_REASON_BYTES, nil=True)),
              Field("by", text(MAX_PAUSE_BY_BYTES, nil=True)),
              Field("group", text(MAX_GROUP_BYTES, empty=False, nil=True))),
    "resume": (Field("group", text(MAX_GROUP_BYTES, empty=False, nil=True)),),
    "cancel": (_JOB_ID,),
    "resolve": (Field("prefix", id_prefix, required=True),),
    "events_since": (Field("epoch", text(64, nil=True)), Field("after", integer(0, 1 << 62)),
                     _PAGE),
    "series": (Field("since", number(0.0, 1e11)), Field("resolution", one_of("1s", "1min")),
               _PAGE),
    "extend": (Field("items", list_of(extend_item, MAX_EXTEND_ITEMS), required=True),),
    "release": (Field("items", list_of(lease_item, MAX_SETTLE_ITEMS), required=True),),
    "update": (  # edit a waiting job (core/edit.py); delay_s and run_at: one or neither
        _JOB_ID,
        Field("body", binary(MAX_BODY_BYTES, nil=True), error=InvalidJob),
        Field("delay_s", number(0.0, MAX_DELAY_S, nil=True), error=InvalidJob),
        Field("run_at", number(0.0, MAX_TIME, nil=True), error=InvalidJob),
        Field("priority", integer(-MAX_PRIORITY, MAX_PRIORITY), error=InvalidJob),
    ),
    "enqueue_slot": (
        Field("body", binary(MAX_BODY_BYTES), required=True, error=InvalidJob),
        Field("job_id", slot_job_id, required=True, error=InvalidJob),
        Field("period_s", number(0.0, 1e11), required=True, error=InvalidJob),  # cron: years
    ),
}
"""Every op an owner answers, with the fields it reads. Ops another module registers on the
owner without an entry here get the envelope check only."""

REPLIES: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    op: (frozenset(always.split()), frozenset(optional.split())) for op, always, optional in (
        ("ping", "node queue", ""),
        ("enqueue", "job_id created", "reason"),
        ("enqueue_many", "created", "job_ids"),
        ("claim", "jobs max_attempts keep_results lease_s",
         "more settled cancel parked unparked waited_s"),
        ("unpark", "unparked", ""),
        ("settle", "statuses", ""),
        ("ack", "status", ""),
        ("nack", "status", ""),
        ("result", "state result", "error"),
        ("dead", "dead total more next_offset", ""),
        ("requeue_dead", "status", "job_id state"),
        ("chord_open", "opened", ""),
        ("chord_reserve", "reserved", ""),
        ("chord_expects", "reserved", ""),
        ("stats", "stats", ""),
        ("jobs", "jobs offset limit more next_offset", "unsearched"),
        ("leases", "leases more next_offset", ""),
        ("why", "why", ""),
        ("logs", "state attempts more next_after", ""),
        ("events", "events more", ""),
        ("follow", "key ttl_s", ""),
        ("requeue", "job_id", "status"),
        ("purge_dead", "purged", ""),
        ("pause", "paused", "pause group"),
        ("resume", "paused", "was group"),
        ("cancel", "status", ""),
        ("resolve", "matches more", ""),
        ("events_since", "epoch events seqs missed more last", ""),
        ("series", "rows more next_since resolution now", ""),
        ("extend", "statuses", ""),
        ("release", "statuses", ""),
        ("enqueue_slot", "job_id created", ""),
        ("update", "status", ""),
        ("workers", "workers total more next_offset now", ""),
        ("states", "states", ""),
        ("requeue_all_dead", "requeued more", ""),
        ("promote", "promoted more", ""),
        ("purge_dead_older", "purged more", ""),
    )
}
"""The fields of each op's success reply besides ``v`` and ``ok``: (always, sometimes)."""
CLAIMED_JOB = ("job_id", "body", "attempt", "token", "worker", "deadline", "last_error", "meta")
CLAIMED_JOB_SOMETIMES = ("start_by",)  # a job that never started and has a start deadline
DEAD_LETTER = ("job_id", "body", "attempts", "last_error", "history", "meta", "finished_at")
HISTORY_ENTRY = ("attempt", "worker", "claimed_at", "finished_at", "outcome", "error",
                 "backoff_s", "traceback")
EVENT = ("t", "node", "queue", "job_id", "kind", "attempt", "worker", "detail")
CHORD_EVENT = ("chord_id", "change", "index", "size", "stalled_by")
"""The ``detail`` of a ``chord`` event, which names a chord member (``job_id``): the chord's
id, ``change`` (one of :data:`CHORD_CHANGES`), the member's index, the chord's size and the
indexes of the members stalling the chord now (sorted)."""
CHORD_CHANGES = ("stalled", "resumed")
"""``stalled``: the member was dead-lettered, or cancelled (for good: a cancelled job never runs
again), and the chord's callback waits for it;
``resumed``: it is no longer dead (revived), so it no longer stalls the chord."""
LEASE = ("job_id", "worker", "deadline", "attempt")  # never the token
JOB_SUMMARY = ("job_id", "state", "priority", "attempts", "enqueued_at", "ready_at", "worker",
               "deadline", "last_error", "body", "progress", "progress_note")

ADMIN_OPS = frozenset({"requeue", "requeue_dead", "purge_dead", "pause", "resume", "cancel",
                       "requeue_all_dead", "promote", "purge_dead_older"})
"""Ops that change a job's fate other than enqueue/claim/ack/nack: they need ``admin=True``."""


ROLES = ("produce", "work", "read", "admin")
"""Each op travels on the key of its role, ``{prefix}/q/{queue}/rpc/{role}``, so Zenoh access
control can grant them apart: producers ``produce`` (and ``read`` for results), workers
``work`` (and ``produce`` if they run chains), operators ``read`` and ``admin``."""

_ROLE_SET = frozenset(ROLES)

OP_ROLES: dict[str, str] = {
    **dict.fromkeys(("enqueue", "enqueue_many", "enqueue_slot", "chord_open", "chord_reserve",
                     "update"), "produce"),
    **dict.fromkeys(("claim", "unpark", "settle", "ack", "nack", "extend", "release"), "work"),
    **dict.fromkeys(("ping", "result", "dead", "stats", "jobs", "leases", "why", "events",
                     "follow", "workers", "states", "chord_expects", "resolve", "series",
                     "events_since", "logs"), "read"),
    **dict.fromkeys(ADMIN_OPS, "admin"),
}


def role_of(op: str) -> str:
    """The role key ``op`` travels on; an op this table does not know (an extension's) is
    ``admin``, the narrowest grant, unless its extension registers it in :data:`OP_ROLES`."""
    return OP_ROLES.get(op, "admin")


def role_in_key(rpc_base: str, key: str) -> str | None:
    """The role a request key names under a queue's rpc key (``{rpc_base}/{role}``), or None
    when the key is malformed: no role, an unknown one, chunks after it, or wildcards."""
    if len(key) <= len(rpc_base) + 1 or not key.startswith(rpc_base) \
            or key[len(rpc_base)] != "/":
        return None
    role = key[len(rpc_base) + 1:]
    return role if role in _ROLE_SET else None


def check_role(op: str, role: str) -> None:
    """Refuse a request that arrived on another role's key than its op's (an ACL that grants
    ``produce`` only must not let a ``claim`` through on that key)."""
    want = role_of(op)
    if role != want:
        raise ProtocolError(f"op {op[:40]!r} goes to the rpc/{want} key, not rpc/{role[:40]}")


def check_envelope(msg: Any) -> str:
    """The op of a decoded request; raises :class:`ProtocolError` if it is no request at all."""
    if type(msg) is not dict:
        raise ProtocolError("a request must be a map")
    version = msg.get("v")
    if type(version) is not int or version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version!r} (this node speaks "
                            f"{VERSION}, an integer)")
    op = msg.get("op")
    if not isinstance(op, str):
        raise ProtocolError(f"op must be a string, got {repr(op)[:60]}")
    return op


# -- fast paths: the hot ops' usual, plainly valid shape, accepted in one expression ----------
# Each accepts a subset of what its schema accepts (tests/test_fast_path.py checks that with
# generated requests, and tests/test_protocol.py on the hostile generator's messages), so a
# request gets the same answer on either path; anything else goes through the schema, which
# names the problem.
def _id(v: Any, limit: int) -> bool:
    return type(v) is str and 0 < len(v) <= limit and v.isascii() and v.isprintable()


def _tok(v: Any) -> bool:
    return type(v) is str and 0 < len(v) <= MAX_TOKEN_BYTES and v.isascii() and v.isalnum()


def _bin(r: Any) -> bool:
    return r is None or (type(r) is bytes and len(r) <= MAX_BODY_BYTES)


def _err(e: Any) -> bool:
    return e is None or (type(e) is str and len(e) <= 1 << 18)  # 4 bytes a char: < 1 MiB


def _after(a: Any) -> bool:
    return a is None or ((type(a) is float or type(a) is int) and 0 <= a <= MAX_DELAY_S)


def _logs(lines: Any) -> bool:  # (anything unusual takes the schema's path)
    return lines is None or (type(lines) is list and len(lines) <= MAX_LOG_LINES and all(
        type(x) is str and len(x) <= MAX_LOG_LINE_BYTES and x.isascii() for x in lines))


def _count(c: Any) -> bool:  # logs_at, logs_dropped: as the schema's integer(0, 2**31 - 1)
    return type(c) is int and 0 <= c < 1 << 31


def _item(i: Any) -> bool:
    return type(i) is dict and i.get("op") in SETTLE_OPS and _fast_ack(i) \
        and _err(i.get("error")) and _err(i.get("traceback")) \
        and _after(i.get("retry_after")) and _logs(i.get("logs")) \
        and _count(i.get("logs_dropped", 0)) and _count(i.get("logs_at", 0))


def _fast_ack(m: dict[str, Any]) -> bool:
    return _id(m.get("job_id"), MAX_JOB_ID_BYTES) and _tok(m.get("token")) \
        and _bin(m.get("result"))


def _fast_nack(m: dict[str, Any]) -> bool:
    return _id(m.get("job_id"), MAX_JOB_ID_BYTES) and _tok(m.get("token")) \
        and _err(m.get("error")) and _err(m.get("traceback")) and _after(m.get("retry_after"))


def _fast_settle(m: dict[str, Any]) -> bool:
    items = m.get("items")
    return type(items) is list and len(items) <= MAX_SETTLE_ITEMS and all(map(_item, items))


def _fast_claim(m: dict[str, Any]) -> bool:
    w, n, s, p = m.get("workers"), m.get("node", ""), m.get("settle"), m.get("park_s", 0)
    return (type(p) is float or type(p) is int) and 0 <= p <= MAX_PARK_S \
        and _tok(m.get("park_key", "k")) \
        and type(w) is list and 0 < len(w) <= MAX_SLOTS \
        and all(_id(x, MAX_SLOT_ID_BYTES) for x in w) and len(set(w)) == len(w) \
        and type(n) is str and len(n) <= MAX_SLOT_ID_BYTES and n.isascii() \
        and (s is None or (type(s) is list and len(s) <= MAX_SETTLE_ITEMS
                           and all(map(_item, s))))


def _fast_enqueue(m: dict[str, Any]) -> bool:
    b, d, p = m.get("body"), m.get("delay_s", 0), m.get("priority", 0)
    return type(b) is bytes and len(b) <= MAX_BODY_BYTES and m.get("meta") is None \
        and _id(m.get("job_id", "x"), MAX_JOB_ID_BYTES) \
        and (type(d) is float or type(d) is int) and 0 <= d <= MAX_DELAY_S \
        and type(p) is int and -MAX_PRIORITY <= p <= MAX_PRIORITY and _after(m.get("dedup_s")) \
        and _group(m.get("group")) and "expires_s" not in m and "start_by" not in m \
        and m.get("unique") is None and m.get("debounce") is None


def _group(g: Any) -> bool:  # (a non-ASCII name takes the schema's path)
    return g is None or (type(g) is str and 0 < len(g) <= MAX_GROUP_BYTES and g.isascii())


def _fast_enqueue_item(i: Any) -> bool:
    return type(i) is dict and "job_id" in i and "meta" not in i and _fast_enqueue(i) \
        and not i["job_id"].startswith(RESERVED_ID_PREFIXES)


def _fast_enqueue_many(m: dict[str, Any]) -> bool:
    items = m.get("items")
    return type(items) is list and len(items) <= MAX_ENQUEUE_ITEMS \
        and all(map(_fast_enqueue_item, items))


FAST: dict[str, Callable[[dict[str, Any]], bool]] = {
    "enqueue": _fast_enqueue, "enqueue_many": _fast_enqueue_many,
    "claim": _fast_claim, "settle": _fast_settle,
    "ack": _fast_ack, "nack": _fast_nack,
}


def check_request(msg: Any, known: Callable[[str], bool]) -> str:
    """Validate a request against its op's schema; returns the op. ``known`` says whether the
    owner serves an op (extra ops registered by other modules count)."""
    op = check_envelope(msg)
    fast = FAST.get(op)
    if fast is not None and fast(msg):
        return op
    fields = SCHEMAS.get(op)
    if fields is None and not known(op):
        raise ProtocolError(f"unknown op {op[:40]!r}")
    if fields:
        check_fields(msg, fields)
    return op


def clip_error(error: str | None) -> str:
    """A nack's error text as stored: at most ``MAX_ERROR_BYTES`` UTF-8 bytes."""
    if not error:
        return "error"
    if len(error) <= MAX_ERROR_BYTES // 4:
        return error
    raw = error.encode("utf-8", "replace")
    if len(raw) <= MAX_ERROR_BYTES:
        return error
    return raw[:MAX_ERROR_BYTES - 3].decode("utf-8", "ignore") + "..."


def clip_traceback(tb: str | None) -> str | None:
    """A failed attempt's traceback as stored: at most ``MAX_TRACEBACK_BYTES`` UTF-8 bytes.
    A longer one loses its *outer* frames (the start): the innermost frames and the exception
    line, at the end, are what says what went wrong."""
    if not tb:
        return None
    if len(tb) <= MAX_TRACEBACK_BYTES // 4:
        return tb
    raw = tb.encode("utf-8", "replace")
    if len(raw) <= MAX_TRACEBACK_BYTES:
        return tb
    tail = raw[-(MAX_TRACEBACK_BYTES - 64):].decode("utf-8", "ignore")
    frame = tail.find("\n  File ")
    newline = frame if frame >= 0 else tail.find("\n")
    if 0 <= newline < len(tail) - 1:
        tail = tail[newline + 1:]  # start at a whole frame (else a whole line)
    cut = len(raw) - len(tail.encode("utf-8"))
    return f"... ({cut} bytes of outer frames cut)\n{tail}"


def latest_traceback(history: list[dict[str, Any]]) -> str | None:
    """The traceback of the newest attempt of a history (as replies carry it) that kept one."""
    for attempt in reversed(history):
        tb = attempt.get("traceback") if isinstance(attempt, dict) else None
        if isinstance(tb, str) and tb:
            return tb
    return None


# -- replies ------------------------------------------------------------------------------------
ERROR_CLASSES: dict[str, type[IstosError]] = {
    cls.__name__: cls for cls in (
        errors.QueueNotFound, errors.OwnerUnavailable, errors.StorageUnavailable,
        errors.ProtocolError, errors.AdminDisabled, errors.InvalidJob, errors.ConfigError,
        errors.CronError, errors.HAConfigError, errors.FencedOut, errors.InvalidProgress,
        errors.CapacityExceeded,
    )
}
"""The error names a reply may carry, and the class a client raises for each (any other
name becomes :class:`~istos.errors.RemoteError`)."""

def error_reply(exc: BaseException) -> dict[str, Any]:
    """The rejection map; the error name is always an :class:`IstosError` subclass."""
    name = type(exc).__name__ if isinstance(exc, IstosError) else "ProtocolError"
    return {"v": VERSION, "ok": False, "error": name, "message": str(exc)[:2000]}


def encode_reply(reply: dict[str, Any]) -> bytes:
    """Encode a reply; one that cannot be encoded or is over the frame cap becomes an error."""
    try:
        raw = codec.encode_spliced(reply) if type(reply) is codec.Spliced \
            else codec.encode_message(reply)
    except (TypeError, ValueError, OverflowError) as exc:
        return codec.encode_message(error_reply(ProtocolError(f"reply not encodable: {exc}")))
    if len(raw) > FRAME_CAP:
        return codec.encode_message(error_reply(ProtocolError(
            f"reply of {len(raw)} bytes exceeds the frame cap {FRAME_CAP}")))
    return raw


def encoded_size(value: Any) -> int:
    return len(msgpack.packb(value, use_bin_type=True))


def claimed_size(job_id: str, body: bytes, worker: str, last_error: str | None,
                 meta_value: dict[str, Any] | None) -> int:
    """An upper bound of one job's entry in a claim reply (its token at the longest), without
    encoding the body: strings count 4 bytes a character (the most UTF-8 takes)."""
    size = len(body) + 4 * (len(job_id) + len(worker)) + MAX_TOKEN_BYTES + 128
    if last_error:
        size += 4 * len(last_error)
    if meta_value:
        size += encoded_size(meta_value)
    return size


def page(items: Iterable[T], render: Callable[[T], dict[str, Any]], limit: int,
         budget: int = PAGE_BUDGET) -> tuple[list[dict[str, Any]], bool]:
    """Render items into a page of at most ``limit`` entries and ``budget`` encoded bytes.

    Returns the page and whether more items remain. The first item is always taken (every
    item fits alone in a frame: the limits above make sure of it), so paging always advances.
    """
    out: list[dict[str, Any]] = []
    used = 0
    it: Iterator[T] = iter(items)
    for item in it:
        if len(out) >= limit:
            return out, True
        entry = render(item)
        size = encoded_size(entry)
        if out and used + size > budget:
            return out, True
        out.append(entry)
        used += size
    return out, False


class RejectLog:
    """Rate-limited logging of rejected requests: one line per (peer, kind) per interval, and
    at most ``max_lines`` lines per interval in all (peer names come from the requests, so a
    flood could invent new ones), each line saying how many were suppressed before it."""

    def __init__(self, log: Callable[..., None], interval_s: float = 10.0,
                 max_keys: int = 4096, max_lines: int = 50) -> None:
        self._log = log
        self.interval_s = interval_s
        self._max_keys = max_keys
        self._max_lines = max_lines
        self._last: dict[tuple[str, str], float] = {}
        self._window = (float("-inf"), 0)  # (start, lines written in it)
        self.suppressed = 0

    def note(self, peer: str, kind: str, message: str, now: float) -> bool:
        """Log (or count) one rejection; True if a line was written."""
        key = (peer[:64], kind)
        last = self._last.get(key)
        start, lines = self._window
        if now - start >= self.interval_s:
            start, lines = now, 0
        if (last is not None and now - last < self.interval_s) or lines >= self._max_lines:
            self._window = (start, lines)
            self.suppressed += 1
            return False
        if last is None and len(self._last) >= self._max_keys:
            self._last.clear()  # bounded memory: forgetting only costs an extra line per key
        self._last[key] = now
        self._window = (start, lines + 1)
        more = f" ({self.suppressed} similar suppressed before)" if self.suppressed else ""
        self.suppressed = 0
        self._log("rejected %s request from %r: %s%s", kind, key[0], message[:200], more)
        return True


# -- batches (features/batch.py, owner/extensions/batches_ext.py) ----------------------------------
BATCH_KINDS = ("on_death", "on_complete", "on_success")
BATCH_OUTCOMES = ("done", "dead", "cancelled")
MAX_BATCH_DESCRIPTION = 1024  # bytes of a batch's description
_BATCH_ID = Field("batch_id", check_job_id, required=True)
_BATCH_KEY = Field("key", text(64, empty=False), required=True)
_MEMBER = Field("member", check_job_id, required=True)


def batch_callbacks(name: str, value: Any) -> None:
    """``{kind: [queue, encoded input]}`` with kinds among :data:`BATCH_KINDS`."""
    if type(value) is not dict or len(value) > len(BATCH_KINDS):
        fail(name, f"must be a map of at most {len(BATCH_KINDS)} callbacks", value)
    for kind, spec in value.items():
        if kind not in BATCH_KINDS:
            fail(name, f"keys are among {BATCH_KINDS}", kind)
        if type(spec) is not list or len(spec) != 2:
            fail(f"{name}.{kind}", "must be [queue, input]", spec)
        text(MAX_JOB_ID_BYTES, empty=False)(f"{name}.{kind}[0]", spec[0])
        binary(MAX_BODY_BYTES)(f"{name}.{kind}[1]", spec[1])


def batch_parent(name: str, value: Any) -> None:
    """A child batch's parent proof: ``{id, home, key}`` (the parent's id, home queue, key)."""
    if value is None:
        return
    if type(value) is not dict or set(value) != {"id", "home", "key"}:
        fail(name, "must be a map of exactly id, home, key", value)
    check_job_id(f"{name}.id", value["id"])
    text(MAX_JOB_ID_BYTES, empty=False)(f"{name}.home", value["home"])
    text(64, empty=False)(f"{name}.key", value["key"])


SCHEMAS.update({
    "batch_open": (_BATCH_ID, _BATCH_KEY, Field("callbacks", batch_callbacks, required=True),
                   Field("description", text(MAX_BATCH_DESCRIPTION)),
                   Field("parent_batch", batch_parent)),
    "batch_reserve": (_BATCH_ID, _BATCH_KEY, Field(
        "kinds", list_of(one_of(*BATCH_KINDS, nil=False), 3, empty=False), required=True)),
    "batch_add": (_BATCH_ID, _BATCH_KEY, _MEMBER,
                  Field("member_queue", text(MAX_JOB_ID_BYTES, empty=False), required=True),
                  Field("parent", check_job_id)),
    "batch_close": (_BATCH_ID, _BATCH_KEY),
    "batch_report": (_BATCH_ID, _BATCH_KEY, _MEMBER,
                     Field("outcome", one_of(*BATCH_OUTCOMES, nil=False), required=True)),
    "batch_status": (_BATCH_ID,),
    "batches": (_PAGE,),
    "batch_members": (_BATCH_ID, Field("state", one_of("pending", *BATCH_OUTCOMES)), _PAGE),
})
REPLIES.update({op: (frozenset(always.split()), frozenset(optional.split()))
                for op, always, optional in (
                    ("batch_open", "opened", ""), ("batch_reserve", "reserved", ""),
                    ("batch_add", "added", ""), ("batch_close", "closed", ""),
                    ("batch_report", "status", ""), ("batch_status", "batch", ""),
                    ("batches", "batches total open", ""), ("batch_members", "members more", ""))})
# Adding, reporting and closing are proven by the batch's key, on the produce key (a member's
# owner reports on the home's produce key too); status and listings are reads.
OP_ROLES.update({**dict.fromkeys(("batch_open", "batch_reserve", "batch_add", "batch_close",
                                  "batch_report"), "produce"),
                 **dict.fromkeys(("batch_status", "batches", "batch_members"), "read")})


# -- dependencies (core/deps.py, client/deps.py, owner/extensions/deps_ext.py) ------------
# The child's key proves a report (the producer made it and handed it to each parent's owner
# with the watch); both ops are on the produce key, as a batch's reports are.
DEP_STATES = ("pending", *BATCH_OUTCOMES)
_KEY_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_")


def dep_key(name: str, value: Any) -> None:
    """A child's key: 16-64 characters of ``[A-Za-z0-9_-]`` (the producer makes 32 hex)."""
    if type(value) is not str or not 16 <= len(value) <= 64 or not _KEY_CHARS.issuperset(value):
        fail(name, "must be a dependency key (16-64 characters of [A-Za-z0-9_-])", value)


_DEP_KEY = Field("key", dep_key, required=True)
SCHEMAS.update({
    "dep_watch": (Field("job_id", check_job_id, required=True),
                  Field("child_queue", text(MAX_JOB_ID_BYTES, empty=False), required=True),
                  Field("child_id", check_job_id, required=True), _DEP_KEY),
    "dep_report": (Field("child_id", check_job_id, required=True),
                   Field("parent_queue", text(MAX_JOB_ID_BYTES, empty=False), required=True),
                   Field("parent_id", check_job_id, required=True),
                   Field("outcome", one_of(*BATCH_OUTCOMES, nil=False), required=True),
                   _DEP_KEY),
})
REPLIES.update({"dep_watch": (frozenset({"state"}), frozenset()),
                "dep_report": (frozenset({"status"}), frozenset())})
OP_ROLES.update(dict.fromkeys(("dep_watch", "dep_report"), "produce"))
