"""The wire fields of a job's life under the producer's control (``istos.protocol`` uses them).

``debounce`` (on ``enqueue`` only) is a map ``{key, s, max_s?, mode?}``: the burst's key, the
quiet time before its job starts, the cap after the burst's first call, and ``last`` (default)
or ``first``: which call's data the job runs with (``core/debounce.py``).

``unique`` (on ``enqueue`` and each ``enqueue_many`` item) is a map ``{key, scope?, s?}``:
the job's unique key, its scope (``queued``, ``active`` or ``finished``; ``active`` when
absent) and, for ``finished``, how long after the job ended the key stays held. Checked like
every field from the network: bounded, typed, never coerced; a bad one is ``InvalidJob``
naming it. :func:`unique_spec` turns a checked map into the owner's
:class:`~istos.core.unique.UniqueSpec`.
"""

from __future__ import annotations

from typing import Any

from .core.debounce import DEBOUNCE_MODES, DebounceSpec
from .core.unique import ACTIVE, FINISHED, MAX_KEY_BYTES, SCOPES, UniqueSpec
from .schema import Field, check_fields, fail, number, one_of, text

MAX_WINDOW_S = 10 * 365 * 86_400.0  # as protocol.MAX_DELAY_S: ten years

_UNIQUE = (
    Field("key", text(MAX_KEY_BYTES, empty=False), required=True),
    Field("scope", one_of(*SCOPES)),
    Field("s", number(0.0, MAX_WINDOW_S, nil=True)),
)


def unique_field(name: str, value: Any) -> None:
    """A ``unique`` field: nil, or ``{key, scope?, s?}`` (``s`` only with ``finished``)."""
    if value is None:
        return
    if type(value) is not dict:
        fail(name, "must be a map {key, scope?, s?}", value)
    check_fields(value, _UNIQUE, prefix=f"{name}.")
    if value.get("s") and value.get("scope") != FINISHED:
        fail(f"{name}.s", "needs scope 'finished'", value.get("s"))


_DEBOUNCE = (
    Field("key", text(MAX_KEY_BYTES, empty=False), required=True),
    Field("s", number(0.0, MAX_WINDOW_S), required=True),
    Field("max_s", number(0.0, MAX_WINDOW_S, nil=True)),
    Field("mode", one_of(*DEBOUNCE_MODES)),
)


def debounce_field(name: str, value: Any) -> None:
    """A ``debounce`` field: nil, or ``{key, s, max_s?, mode?}`` with ``max_s >= s``."""
    if value is None:
        return
    if type(value) is not dict:
        fail(name, "must be a map {key, s, max_s?, mode?}", value)
    check_fields(value, _DEBOUNCE, prefix=f"{name}.")
    cap = value.get("max_s")
    if cap is not None and cap < value["s"]:
        fail(f"{name}.max_s", f"must be at least {name}.s ({value['s']!r})", cap)


def debounce_spec(value: dict[str, Any] | None) -> DebounceSpec | None:
    """The owner's view of a checked ``debounce`` field (None: no key)."""
    if value is None:
        return None
    cap = value.get("max_s")
    return DebounceSpec(value["key"], float(value["s"]), None if cap is None else float(cap),
                        value.get("mode") or "last")


def unique_spec(value: dict[str, Any] | None) -> UniqueSpec | None:
    """The owner's view of a checked ``unique`` field (None: no key)."""
    if value is None:
        return None
    s = value.get("s")
    return UniqueSpec(value["key"], value.get("scope") or ACTIVE,
                      float(s) if s else None)
