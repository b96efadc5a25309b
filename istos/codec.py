"""msgpack encoding of job bodies and wire messages.

Job bodies are encoded once by the producer and travel as opaque bytes through the owner and
storage; only the worker decodes them. That keeps the owner's cost per job independent of the
body's shape.
"""

from __future__ import annotations

import threading
from typing import Any

import msgpack

from .errors import InvalidJob, ProtocolError

PROTOCOL_VERSION = 1
MAX_BODY_BYTES = 1 << 20  # 1 MiB: larger payloads belong in object storage, referenced by key
MAX_MESSAGE_BYTES = MAX_BODY_BYTES + (64 << 10)


# msgpack.packb builds a Packer per call, which costs more than packing a small message; a
# Packer is reusable (it resets after each pack, and after an error) but not thread-safe, so
# each thread keeps its own.
_local = threading.local()


def _pack(obj: Any) -> bytes:
    try:
        packer = _local.packer
    except AttributeError:
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    return packer.pack(obj)  # type: ignore[no-any-return]


def encode_body(data: Any, *, queue: str = "?", limit: int = MAX_BODY_BYTES) -> bytes:
    """Encode a job body; raise :class:`InvalidJob` before anything is sent if it cannot be
    or is over ``limit`` bytes (larger than the wire's only for an offload codec to store)."""
    try:
        raw = _pack(data)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidJob(
            f"job body for queue {queue!r} cannot be encoded with msgpack: {exc}; "
            "use dicts, lists, str, bytes, numbers, bools and None"
        ) from exc
    if len(raw) > limit:
        raise InvalidJob(
            f"job body for queue {queue!r} is {len(raw)} bytes; the limit is {limit}"
        )
    return raw


def decode_body(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False, strict_map_key=False)


def encode_message(msg: dict[str, Any]) -> bytes:
    return _pack(msg)


class Packed:
    """A list whose items are already msgpack-encoded, spliced as they are into a
    :class:`Spliced` message when it is encoded (an owner packs a page of events in slices of
    its loop's time and keeps only bytes, which the cyclic GC never walks)."""

    __slots__ = ("items",)

    def __init__(self, items: list[bytes]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def encoded(self) -> bytes:
        """The msgpack array of the items."""
        n = len(self.items)
        head = bytes((0x90 | n,)) if n < 16 else \
            b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdd" + n.to_bytes(4, "big")
        return head + b"".join(self.items)

    def decoded(self) -> list[Any]:
        """The items as plain values (what the same list would decode to off the wire)."""
        value: list[Any] = msgpack.unpackb(self.encoded(), raw=False, strict_map_key=False)
        return value


class Spliced(dict[str, Any]):
    """A message some of whose values are :class:`Packed`: :func:`encode_spliced` writes
    their bytes in place; :meth:`plain` is the same message with every value decoded."""

    def plain(self) -> dict[str, Any]:
        """The message as a plain dict (for an in-process caller, which never encodes it)."""
        return {k: v.decoded() if isinstance(v, Packed) else v for k, v in self.items()}


def encode_spliced(msg: Spliced) -> bytes:
    """Encode ``msg`` as :func:`encode_message` would its :meth:`Spliced.plain` form, without
    decoding the packed values (the bytes are the same)."""
    n = len(msg)
    parts = [bytes((0x80 | n,)) if n < 16 else
             b"\xde" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdf" + n.to_bytes(4, "big")]
    for key, value in msg.items():
        parts.append(_pack(key))
        parts.append(value.encoded() if isinstance(value, Packed) else _pack(value))
    return b"".join(parts)


def decode_message(raw: bytes) -> dict[str, Any]:
    """Decode a wire message; raise :class:`ProtocolError` if it is not one of ours."""
    if len(raw) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(raw)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        msg = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"undecodable message: {exc}") from exc
    if not isinstance(msg, dict):
        raise ProtocolError("message is not a map")
    version = msg.get("v")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {version!r} (this node speaks 1)")
    return msg
