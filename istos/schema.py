"""Generic, non-coercing checks of decoded msgpack values, for the request schemas.

Each check is ``check(name, value)`` and raises :class:`~istos.errors.ProtocolError` naming the
field and showing (a prefix of) the value; :class:`Field` may retype that error. Checks never
convert: ``"5"`` is not an integer, ``True`` is not an integer, ``1.0`` is not an integer.
The Istos-specific limits and schemas built from these live in :mod:`istos.protocol`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .errors import IstosError, ProtocolError

_ABSENT = object()
MAX_NODES_WALKED = 100_000  # a nesting check gives up (and refuses) past this many values
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

Check = Callable[[str, Any], None]


@dataclass(frozen=True, slots=True)
class Field:
    """One request field: its check, whether it must be present, and the error it raises."""

    name: str
    check: Check
    required: bool = False
    error: type[IstosError] = ProtocolError


# -- checks (each raises ProtocolError naming the field; Field.error may retype it) -------------
def fail(name: str, why: str, value: Any) -> None:
    shown = repr(value)
    raise ProtocolError(f"{name} {why}, got {shown[:60] + '...' if len(shown) > 60 else shown}")


def integer(lo: int, hi: int) -> Check:
    def check(name: str, value: Any) -> None:
        if type(value) is int and lo <= value <= hi:
            return
        if type(value) is not int:
            fail(name, "must be an integer", value)
        if not lo <= value <= hi:
            fail(name, f"must be between {lo} and {hi}", value)
    return check


def number(lo: float, hi: float, *, nil: bool = False) -> Check:
    def check(name: str, value: Any) -> None:
        if (type(value) is float or type(value) is int) and lo <= value <= hi:
            return  # finite bounds: NaN and the infinities fail the comparison
        if value is None and nil:
            return
        if type(value) not in (int, float) or not math.isfinite(value):
            fail(name, "must be a finite number", value)
        if not lo <= value <= hi:
            fail(name, f"must be between {lo:g} and {hi:g}", value)
    return check


def binary(max_bytes: int, *, nil: bool = False) -> Check:
    def check(name: str, value: Any) -> None:
        if type(value) is bytes and len(value) <= max_bytes:
            return
        if value is None and nil:
            return
        if type(value) is not bytes:
            fail(name, "must be bin (msgpack bytes)", value)
        if len(value) > max_bytes:
            raise ProtocolError(f"{name} is {len(value)} bytes; the limit is {max_bytes}")
    return check


def text(max_bytes: int, *, nil: bool = False, empty: bool = True) -> Check:
    def check(name: str, value: Any) -> None:
        if value is None and nil:
            return
        if not isinstance(value, str):  # (a subclass: an Enqueued id given back in-process)
            fail(name, "must be a string", value)
        if not empty and not value:
            fail(name, "must not be empty", value)
        if len(value) > max_bytes or len(value.encode("utf-8", "surrogatepass")) > max_bytes:
            raise ProtocolError(f"{name} is longer than {max_bytes} bytes")
    return check


def identifier(max_bytes: int) -> Check:
    """A non-empty string of at most ``max_bytes`` UTF-8 bytes without NUL or control chars."""
    base = text(max_bytes, empty=False)

    def check(name: str, value: Any) -> None:
        if type(value) is str and 0 < len(value) <= max_bytes and value.isascii() \
                and value.isprintable():
            return  # the common case, decided without encoding or a regex
        base(name, value)
        if _CONTROL.search(value):
            fail(name, "must not contain NUL or control characters", value)
    return check


def boolean(name: str, value: Any) -> None:
    if type(value) is not bool:
        fail(name, "must be true or false", value)


def one_of(*choices: Any, nil: bool = True) -> Check:
    def check(name: str, value: Any) -> None:
        if value is None and nil:
            return
        if type(value) is not str or value not in choices:
            fail(name, f"must be one of {', '.join(map(str, choices))}", value)
    return check


def nesting(value: Any, max_depth: int, max_nodes: int = MAX_NODES_WALKED) -> int:
    """The nesting depth of ``value`` (a scalar is 0); raises past ``max_depth`` or when the
    value holds more than ``max_nodes`` items (iterative: no recursion limit to hit)."""
    deepest, walked = 0, 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[Any] = list(item.keys()) + list(item.values())
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        depth += 1
        if depth > max_depth:
            raise ProtocolError(f"nested deeper than {max_depth} levels")
        deepest = max(deepest, depth)
        for child in children:
            walked += 1
            if walked > max_nodes:
                raise ProtocolError(f"holds more than {max_nodes} values")
            stack.append((child, depth))
    return deepest


def list_of(item: Check, max_items: int, *, nil: bool = False, empty: bool = True) -> Check:
    def check(name: str, value: Any) -> None:
        if value is None and nil:
            return
        if type(value) is not list:
            fail(name, "must be a list", value)
        if len(value) > max_items:
            raise ProtocolError(f"{name} has {len(value)} items; the limit is {max_items}")
        if not empty and not value:
            fail(name, "must not be empty", value)
        for i, entry in enumerate(value):
            item(f"{name}[{i}]", entry)
    return check


def check_fields(msg: dict[str, Any], fields: tuple[Field, ...], prefix: str = "") -> None:
    get = msg.get
    for spec in fields:
        name = spec.name
        value = get(name, _ABSENT)
        if value is _ABSENT:
            if spec.required:
                raise ProtocolError(f"missing field {prefix}{name}")
            continue
        try:
            spec.check(prefix + name if prefix else name, value)
        except ProtocolError as exc:
            if spec.error is ProtocolError:
                raise
            raise spec.error(str(exc)) from None
