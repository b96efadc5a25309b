"""PURE: the shapes of job ``meta`` the workflow code writes, and the proof they carry.

Workflow meta makes the owner (chord callbacks) or a worker (chain continuations) enqueue
follow-up jobs, so an owner accepts only what :mod:`istos.features.workflow` itself writes;
anything else is refused with :class:`~istos.errors.InvalidJob` before it is stored.

**Proof.** Whoever starts a workflow picks a random ``key`` (128 bits from the node's id
source) and derives the workflow's id from it: ``wf:`` + 32 hex digits of
``sha256(kind, key, the fixed parts)``, the fixed parts being a chain's queue list and
priority, or a chord's member queue, size and callback queue. Every job of the workflow (a
chain step ``{id}.{step}``, a chord member ``{id}.{index}``, the callback ``{id}.callback``)
carries the key in its meta, and its owner recomputes the id: a sender that only *read* an id
(``jobs``, ``events``, a dead letter, none of which show the key) cannot continue, redirect or
pre-empt the workflow, and a changed queue list or callback queue changes the id. Job ids
starting with ``wf:`` (and ``sched:``, a schedule's slots) are reserved: a plain enqueue may not
create them. The check is one hash of a few hundred bytes: O(1) on the request path.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..errors import ConfigError, InvalidJob
from ..protocol import RESERVED_ID_PREFIXES
from .config import check_priority, check_queue_name

CHAIN_KEYS = ("id", "queues", "step", "priority", "key")
CHORD_KEYS = ("id", "index", "size", "callback", "input", "key")
CALLBACK_KEYS = ("id", "queue", "size", "key")
WORKFLOW_PREFIX = "wf:"
RESERVED_PREFIXES = RESERVED_ID_PREFIXES  # wf: and sched:
_HEX = frozenset("0123456789abcdef")


def reserved(job_id: str) -> bool:
    """Whether ``job_id`` is in a namespace a plain enqueue may not create."""
    return job_id.startswith(RESERVED_PREFIXES)


def _derive(kind: str, key: str, parts: list[Any]) -> str:
    raw = json.dumps([kind, key, *parts], separators=(",", ":"), ensure_ascii=True)
    return WORKFLOW_PREFIX + hashlib.sha256(raw.encode()).hexdigest()[:32]


def chain_id(key: str, queues: list[str], priority: int) -> str:
    """The id of the chain started with ``key`` over ``queues`` at ``priority``."""
    return _derive("chain", key, [list(queues), priority])


def chord_id(key: str, queue: str, size: int, callback: str) -> str:
    """The id of the chord started with ``key``: ``size`` members on ``queue``, the callback
    on ``callback`` (fixed at the start: another callback queue is another id)."""
    return _derive("chord", key, [queue, size, callback])


def check_key(job_id: str, key: Any) -> str:
    if type(key) is not str or not 32 <= len(key) <= 64 or not _HEX.issuperset(key):
        raise InvalidJob(f"job {job_id!r}: a workflow key is 32-64 lowercase hex digits")
    return key


def public_meta(meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """``meta`` as read ops show it: without the workflow's key (only its jobs' claimers and
    owners hold that)."""
    if not meta:
        return meta
    out: dict[str, Any] = {}
    for kind, entry in meta.items():
        out[kind] = {k: v for k, v in entry.items() if k != "key"} \
            if isinstance(entry, dict) else entry
    return out


def check_workflow_meta(queue: str, job_id: str, meta: dict[str, Any] | None
                        ) -> dict[str, Any] | None:
    """Check ``meta`` of job ``job_id`` enqueued on ``queue``. Returns the chord or callback
    entry (whose barrier or reservation the caller still has to find), None for a chain step.
    A reserved job id with no meta at all is refused too."""
    if meta is None:
        raise InvalidJob(f"job id {job_id[:60]!r}: ids starting with "
                         f"{' or '.join(map(repr, RESERVED_PREFIXES))} are made by workflows and "
                         "schedules only (app.chain, app.chord, app.schedule)")
    if set(meta) == {"chain"}:
        check_chain_meta(queue, job_id, meta["chain"])
        return None
    if set(meta) == {"callback"}:
        return _check_callback(queue, job_id, meta["callback"])
    if set(meta) != {"chord"}:
        raise InvalidJob(f"job {job_id!r}: meta must be a workflow's ({{'chain': ...}}, "
                         f"{{'chord': ...}} or {{'callback': ...}}), got keys "
                         f"{sorted(map(str, meta))[:5]}")
    chord = meta["chord"]
    _check_shape(job_id, chord, CHORD_KEYS)
    size, index = chord["size"], chord["index"]
    if type(size) is not int or type(index) is not int or not 0 <= index < size:
        raise InvalidJob(f"job {job_id!r}: chord index/size must be integers with "
                         f"0 <= index < size, got {index!r}/{size!r}")
    _check_name(job_id, chord["callback"])
    key = check_key(job_id, chord["key"])
    if chord["id"] != chord_id(key, queue, size, chord["callback"]):
        raise InvalidJob(f"job {job_id!r}: its chord id does not match its key, queue, size "
                         "and callback (a chord member comes from app.chord)")
    if job_id != f"{chord['id']}.{index}":
        raise InvalidJob(f"job {job_id!r}: a chord member's id is '<chord id>.<index>'")
    return chord  # type: ignore[no-any-return]


def _check_callback(queue: str, job_id: str, entry: Any) -> dict[str, Any]:
    _check_shape(job_id, entry, CALLBACK_KEYS)
    size = entry["size"]
    if type(size) is not int or size < 0:
        raise InvalidJob(f"job {job_id!r}: a chord's size is an integer >= 0")
    _check_name(job_id, entry["queue"])
    key = check_key(job_id, entry["key"])
    if entry["id"] != chord_id(key, entry["queue"], size, queue) \
            or job_id != f"{entry['id']}.callback":
        raise InvalidJob(f"job {job_id!r}: not the callback of a chord whose callback queue "
                         f"is {queue!r} (callbacks come from the chord's barrier)")
    return entry  # type: ignore[no-any-return]


def _check_shape(job_id: str, value: Any, keys: tuple[str, ...]) -> None:
    if not isinstance(value, dict) or set(value) != set(keys):
        raise InvalidJob(f"job {job_id!r}: workflow meta must be a map of exactly "
                         f"{', '.join(keys)}")


def _check_name(job_id: str, name: Any) -> None:
    try:
        check_queue_name(name)
    except ConfigError as exc:
        raise InvalidJob(f"job {job_id!r}: {exc}") from None


def check_chain_meta(queue: str, job_id: str, step: Any) -> None:
    """The shape ``chain`` and its continuations write: ``{id, queues, step, priority, key}``,
    the id derived from the key, queues and priority, the job id ``'<id>.<step>'`` and this
    queue at ``queues[step]``."""
    _check_shape(job_id, step, CHAIN_KEYS)
    queues, index, prio = step["queues"], step["step"], step["priority"]
    try:
        if not isinstance(queues, list) or not queues or len(queues) > 1000:
            raise ConfigError("chain queues must be a list of 1 to 1000 queue names")
        for name in queues:
            check_queue_name(name)
        check_priority(prio)
    except ConfigError as exc:
        raise InvalidJob(f"job {job_id!r}: {exc}") from None
    if type(index) is not int or not 0 <= index < len(queues) or queues[index] != queue:
        raise InvalidJob(f"job {job_id!r}: chain step {index!r} is not queue {queue!r}")
    key = check_key(job_id, step["key"])
    if step["id"] != chain_id(key, queues, prio):
        raise InvalidJob(f"job {job_id!r}: its chain id does not match its key, queues and "
                         "priority (a chain step comes from app.chain or its previous step)")
    if job_id != f"{step['id']}.{index}":
        raise InvalidJob(f"job {job_id!r}: a chain step's id is '<chain id>.<step>'")
