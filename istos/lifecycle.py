"""A job's life under the producer's control, the producer's side: checks and replies.

:func:`check_unique` checks ``enqueue(..., unique_key=, unique=, unique_s=)`` before anything
is sent (the owner's side is :mod:`istos.core.unique`); :class:`Enqueued` is what an enqueue
returns: the job id, which is a ``str``, saying also whether that job is new and, if not, why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from . import codec
from .core.config import check_delay, check_priority, check_queue_name
from .core.debounce import DEBOUNCE_MODES, DebounceSpec, Mode
from .core.unique import FINISHED, MAX_KEY_BYTES, SCOPES, Scope, UniqueSpec, check_window
from .errors import ConfigError, ProtocolError
from .protocol import MAX_TIME, check_job_id
from .wire_lifecycle import MAX_WINDOW_S

__all__ = ["UNSET", "Enqueued", "check_debounce", "check_unique", "check_unique_keys",
           "check_update"]

UNSET: Any = type("Unset", (), {"__repr__": lambda self: "UNSET"})()
"""``update``'s default ``data``: leave the body as it is (None is data too)."""


class Enqueued(str):
    """The id an enqueue resolved to; a ``str``, so it is used as the job id it always was.

    ``created``: whether this call added the job. Otherwise ``reason`` says why it did not:
    ``"job_id"`` (the queue holds that id, or keeps it reserved by ``dedup_s``),
    ``"unique_key"`` (another job holds the key; the id is that job's) or ``"debounce_key"``
    (the call joined an open burst: the id is the burst's job, its data and start changed).
    ``queue``: the queue it is on (None when not known), so it names a parent in another
    enqueue's ``after=[...]``.
    """

    created: bool
    reason: str | None
    queue: str | None

    def __new__(cls, job_id: str, created: bool = True, reason: str | None = None,
                queue: str | None = None) -> Enqueued:
        self = super().__new__(cls, job_id)
        self.created = created
        self.reason = None if created else reason
        self.queue = queue
        return self

    @property
    def job_id(self) -> str:
        """The id as a plain ``str``."""
        return str.__str__(self)

    @property
    def deduplicated_by(self) -> str | None:
        """``reason``, under the name other queues use: None when the job is new."""
        return self.reason

    @classmethod
    def from_reply(cls, reply: dict[str, Any], queue: str | None = None) -> Enqueued:
        """From an ``enqueue`` reply (``job_id``, ``created``, ``reason?``) on ``queue``."""
        created = reply.get("created", True)
        reason = reply.get("reason")
        return cls(str(reply["job_id"]), created is not False,
                   reason if isinstance(reason, str) else "job_id", queue)


def check_unique(unique_key: object, unique: object, unique_s: object) -> UniqueSpec | None:
    """``enqueue``'s unique-key options as one spec (None: no key), checked before sending.

    Raises:
        ConfigError: naming the field: a key that is not a non-empty string of at most 200
            UTF-8 bytes, an unknown scope, a negative, non-finite or too long ``unique_s``,
            ``unique_s`` with another scope than ``finished``, or a scope or window without
            a key.
    """
    if unique_key is None:
        if unique is not None or unique_s is not None:
            raise ConfigError("unique and unique_s need a unique_key")
        return None
    unique_key = _key("unique_key", unique_key)
    scope = "active" if unique is None else unique
    if scope not in SCOPES:
        raise ConfigError(f"unique must be one of {', '.join(SCOPES)}, got {unique!r}")
    window = None
    if unique_s is not None:
        window = _window("unique_s", unique_s)
        if scope != FINISHED:
            raise ConfigError(f"unique_s needs unique='finished' (the key is held that long "
                              f"after the job ended), got unique={scope!r}")
    return UniqueSpec(unique_key, cast(Scope, scope), window or None)


def check_unique_keys(items: Sequence[object], unique_keys: Sequence[str | None] | None,
                      unique: object, unique_s: object) -> list[UniqueSpec | None] | None:
    """``enqueue_many``'s unique keys, one spec (or None) per item; None without keys.

    Raises:
        ConfigError: ``unique_keys`` has not one entry per item, or as :func:`check_unique`,
            naming the item.
    """
    if unique_keys is None:
        if unique is not None or unique_s is not None:
            raise ConfigError("unique and unique_s need unique_keys")
        return None
    keys = list(unique_keys)
    if len(keys) != len(items):
        raise ConfigError(f"unique_keys has {len(keys)} entries for {len(items)} items")
    check_unique("k", unique, unique_s)  # the scope and window once, for every item
    out: list[UniqueSpec | None] = []
    for i, key in enumerate(keys):
        try:
            out.append(None if key is None else check_unique(key, unique, unique_s))
        except ConfigError as exc:
            raise ConfigError(f"item {i}: {exc}") from None
    return out


def check_update(name: str, job_id: object, data: Any, delay_s: object, run_at: object,
                 priority: object) -> dict[str, Any]:
    """``update``'s arguments as the op's fields (``body``, ``delay_s``, ``run_at``,
    ``priority``; only those given), checked before anything is sent.

    Raises:
        ConfigError: naming the field: a bad queue name or ``job_id``, a negative,
            non-finite or too long ``delay_s``, a ``run_at`` that is no datetime or epoch
            seconds, a bad ``priority``, both ``delay_s`` and ``run_at``, or nothing to change.
        InvalidJob: ``data`` msgpack cannot encode, or over the size limit.
    """
    check_queue_name(name)
    if not isinstance(job_id, str) or not job_id:
        raise ConfigError(f"job_id must be a non-empty string, got {job_id!r}")
    try:
        check_job_id("job_id", job_id)
    except ProtocolError as exc:
        raise ConfigError(str(exc)) from None
    fields: dict[str, Any] = {}
    if data is not UNSET:
        fields["body"] = codec.encode_body(data, queue=name)
    if delay_s is not None and run_at is not None:
        raise ConfigError("update takes delay_s or run_at, not both")
    if delay_s is not None:
        fields["delay_s"] = check_delay(delay_s)
    if run_at is not None:
        at = run_at.timestamp() if isinstance(run_at, datetime) else run_at
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at) \
                or not 0 <= at <= MAX_TIME:
            raise ConfigError(f"run_at must be a datetime or epoch seconds, got {run_at!r}")
        fields["run_at"] = float(at)
    if priority is not None:
        fields["priority"] = check_priority(priority)
    if not fields:
        raise ConfigError("update needs data, delay_s, run_at or priority")
    return fields


def check_debounce(debounce_key: object, debounce_s: object, debounce_max_s: object,
                   debounce: object, *, delay_s: float, unique: bool) -> DebounceSpec | None:
    """``enqueue``'s debounce options as one spec (None: no key), checked before sending.

    Raises:
        ConfigError: naming the field: a key that is not a non-empty string of at most 200
            UTF-8 bytes, a missing, negative, non-finite or too long ``debounce_s``, a
            ``debounce_max_s`` below ``debounce_s``, a mode other than ``"last"`` or
            ``"first"``, an option without a key, or a key with ``delay_s`` or a unique key
            (a burst's start is its own).
    """
    if debounce_key is None:
        if debounce_s is not None or debounce_max_s is not None or debounce is not None:
            raise ConfigError("debounce_s, debounce_max_s and debounce need a debounce_key")
        return None
    key = _key("debounce_key", debounce_key)
    if debounce_s is None:
        raise ConfigError("debounce_key needs debounce_s (the quiet time before the job starts)")
    quiet = _window("debounce_s", debounce_s)
    cap = None if debounce_max_s is None else _window("debounce_max_s", debounce_max_s)
    if cap is not None and cap < quiet:
        raise ConfigError(f"debounce_max_s ({debounce_max_s!r}) must be at least debounce_s "
                          f"({debounce_s!r})")
    mode = "last" if debounce is None else debounce
    if mode not in DEBOUNCE_MODES:
        raise ConfigError(f"debounce must be 'last' or 'first', got {debounce!r}")
    if delay_s:
        raise ConfigError("delay_s cannot go with debounce_key: the burst's job starts "
                          "debounce_s after its latest call")
    if unique:
        raise ConfigError("unique_key cannot go with debounce_key (a burst is one job already)")
    return DebounceSpec(key, quiet, cap, cast(Mode, mode))


def _key(field: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{field} must be a non-empty string, got {value!r}")
    if len(value.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise ConfigError(f"{field} {value[:40]!r}... is longer than {MAX_KEY_BYTES} bytes")
    return value


def _window(field: str, value: object) -> float:
    try:
        window = check_window(field, value)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if window > MAX_WINDOW_S:
        raise ConfigError(f"{field} must be at most {MAX_WINDOW_S:g} (ten years), got "
                          f"{value!r}")
    return window
