"""Payload codecs: a chain of encode/decode steps that producers and workers apply to job
bodies and results (``Istos(codecs=[ZlibCodec(), AesGcmCodec(keys, "k2")])``).

The producer encodes a body with msgpack, then runs it through each codec in order; the worker
undoes them in reverse before calling the function, and encodes its result the same way. The
owner, storage, dead letters, events and replays only ever hold the encoded bytes: an
*envelope*, a msgpack extension value (type :data:`ENVELOPE_EXT`) holding the codec names in
the order applied and the encoded payload. Anything that decodes a body without the chain sees
an extension value, never plaintext, and never mistakes it for a job's data.

A body whose envelope names other codecs than the reader's chain (or a plain body read by a
chain, or an envelope read without one), a wrong or unknown key and a tampered body each raise
:class:`PayloadCodecError` naming the codec: on a worker that fails the attempt, so the job is
retried and dead-lettered after its attempts, and the function never runs with garbage.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import msgpack

from . import codec
from .errors import ConfigError, InvalidJob, PayloadCodecError

ENVELOPE_EXT = 73  # msgpack extension type of an encoded body ("I")
COMPOSED_EXT = 74  # a chord callback's body the owner composed from encoded parts ("J")
MAX_ENVELOPE_CODECS = 8
MAX_COMPOSED_PARTS = 1 << 16  # (the parts' bytes are bounded by the body limit already)


class Encoded(bytes):
    """A body already encoded (msgpack, and the codecs if any), enqueued as it is: what a
    chord's owner, holding no codecs, composes for the callback (:func:`compose`)."""


@runtime_checkable
class PayloadCodec(Protocol):
    """One step of a chain. ``name`` goes into every envelope (so a reader can tell which
    codecs a body needs); ``decode`` raises :class:`PayloadCodecError` for bytes it cannot
    undo."""

    name: str

    def encode(self, data: bytes) -> bytes: ...

    def decode(self, data: bytes) -> bytes: ...


class ZlibCodec:
    """zlib compression (``level`` 0-9); decoding refuses output over the body limit."""

    name = "zlib"

    def __init__(self, level: int = 6, *, max_output_bytes: int = codec.MAX_BODY_BYTES) -> None:
        if not isinstance(level, int) or not 0 <= level <= 9:
            raise ConfigError(f"ZlibCodec level must be 0..9, got {level!r}")
        if isinstance(max_output_bytes, bool) or not isinstance(max_output_bytes, int) \
                or max_output_bytes < 1:
            raise ConfigError(f"ZlibCodec max_output_bytes must be an integer >= 1, got "
                              f"{max_output_bytes!r}")
        self.level = level
        self.max_output_bytes = max_output_bytes  # larger only before an OffloadCodec

    def encode(self, data: bytes) -> bytes:
        return zlib.compress(data, self.level)

    def decode(self, data: bytes) -> bytes:
        inflater = zlib.decompressobj()
        limit = self.max_output_bytes
        try:  # bounded: a small hostile body must not inflate to gigabytes
            out = inflater.decompress(data, limit + 1)
        except zlib.error as exc:
            raise PayloadCodecError(f"zlib: not a zlib stream: {exc}") from None
        if len(out) > limit or inflater.unconsumed_tail:
            raise PayloadCodecError(f"zlib: inflates past {limit} bytes")
        if not inflater.eof:
            raise PayloadCodecError("zlib: truncated stream")
        return out


class AesGcmCodec:
    """Authenticated encryption with AES-GCM (``cryptography``: the ``crypto`` extra).

    ``keys`` maps key ids to 16-, 24- or 32-byte keys; new bodies are encrypted with
    ``current``, and each carries its key id, so a reader holding old and new keys decodes
    both while keys rotate. Each body has a fresh 96-bit random nonce. Raises
    :class:`ConfigError` for a bad key, id or a ``current`` not in ``keys``, or when
    ``cryptography`` is missing; decoding raises :class:`PayloadCodecError` for an unknown key
    id or a body that does not authenticate (a wrong key, or tampered bytes).
    """

    name = "aes-gcm"
    AAD = b"istos payload v1"

    def __init__(self, keys: Mapping[str, bytes], current: str) -> None:
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError as exc:
            raise ConfigError("AesGcmCodec needs cryptography: "
                              "pip install 'istos-nb[crypto]'") from exc
        if current not in keys:
            raise ConfigError(f"AesGcmCodec: current key id {current!r} is not in keys")
        self._aead: dict[bytes, Any] = {}
        for kid, key in keys.items():
            raw_id = kid.encode() if isinstance(kid, str) else b""
            if not 0 < len(raw_id) < 256:
                raise ConfigError(f"AesGcmCodec: key id {kid!r} must be a str of 1..255 bytes")
            if not isinstance(key, bytes) or len(key) not in (16, 24, 32):
                raise ConfigError(f"AesGcmCodec: key {kid!r} must be 16, 24 or 32 bytes")
            self._aead[raw_id] = AESGCM(key)
        self._current = current.encode()

    def encode(self, data: bytes) -> bytes:
        nonce = os.urandom(12)  # random per body: 2^-32 collision risk only after 2^32 bodies
        sealed = self._aead[self._current].encrypt(nonce, data, self.AAD)
        return bytes([len(self._current)]) + self._current + nonce + sealed

    def decode(self, data: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag

        if not data or len(data) < 1 + data[0] + 12 + 16:
            raise PayloadCodecError("aes-gcm: body too short to be encrypted")
        end = 1 + data[0]
        kid = data[1:end]
        aead = self._aead.get(kid)
        if aead is None:
            raise PayloadCodecError(
                f"aes-gcm: no key with id {kid.decode(errors='replace')!r} (keys held: "
                f"{', '.join(sorted(k.decode() for k in self._aead))})")
        try:
            return bytes(aead.decrypt(data[end:end + 12], data[end + 12:], self.AAD))
        except InvalidTag:
            raise PayloadCodecError(
                f"aes-gcm: body does not authenticate with key "
                f"{kid.decode(errors='replace')!r} (wrong key or tampered bytes)") from None


class CodecChain:
    """The codecs of one app, applied in order on encoding and reversed on decoding. An empty
    chain encodes plain msgpack bodies and refuses envelopes."""

    def __init__(self, codecs: Iterable[PayloadCodec] = ()) -> None:
        self.codecs = list(codecs)
        for c in self.codecs:
            if not isinstance(c, PayloadCodec) or not isinstance(c.name, str) or not c.name:
                raise ConfigError(f"codecs: {c!r} is not a payload codec (a name, encode and "
                                  "decode)")
        if len(self.codecs) > MAX_ENVELOPE_CODECS:
            raise ConfigError(f"codecs: at most {MAX_ENVELOPE_CODECS}, got {len(self.codecs)}")
        self.names = [c.name for c in self.codecs]
        self.max_body_bytes = self._check_offload()

    def _check_offload(self) -> int:
        """The largest body (msgpack) this chain encodes: the wire's limit, or an offload
        codec's (which must come last, after codecs that can inflate that much)."""
        limits = [getattr(c, "max_body_bytes", None) for c in self.codecs
                  if c.name == "offload"]
        if not limits:
            return codec.MAX_BODY_BYTES
        if self.names.index("offload") != len(self.names) - 1:
            raise ConfigError("codecs: the offload codec must be the last one (the store "
                              "holds what the codecs before it made)")
        limit = int(limits[0] or codec.MAX_BODY_BYTES)
        for c in self.codecs:
            bound = getattr(c, "max_output_bytes", None)
            if isinstance(bound, int) and bound < limit:
                raise ConfigError(f"codecs: {c.name} decodes at most {bound} bytes, below the "
                                  f"offload codec's max_body_bytes={limit}: give it "
                                  f"max_output_bytes={limit}")
        return limit

    @property
    def offloads(self) -> bool:
        """Whether bodies larger than the wire's limit may be encoded (an offload codec)."""
        return self.max_body_bytes > codec.MAX_BODY_BYTES

    def encode_body(self, data: Any, *, queue: str = "?") -> bytes:
        """msgpack, then every codec; :class:`InvalidJob` if it cannot be encoded or the
        encoded body is over the limit (with an offload codec: the msgpack body over its
        ``max_body_bytes``, or :class:`~istos.errors.OffloadUnavailable` if the store
        fails)."""
        if not self.offloads:
            raw = codec.encode_body(data, queue=queue)
            return self.wrap(raw, queue=queue) if self.codecs else raw
        raw = codec.encode_body(data, queue=queue, limit=self.max_body_bytes)
        return self.wrap(raw, queue=queue)

    def wrap(self, raw: bytes, *, queue: str = "?") -> bytes:
        """An already msgpack-encoded body through every codec, in an envelope."""
        for c in self.codecs:
            raw = c.encode(raw)
        body = seal(self.names, raw)
        if len(body) > codec.MAX_BODY_BYTES:
            raise InvalidJob(f"job body for queue {queue!r} is {len(body)} bytes once encoded "
                             f"({', '.join(self.names)}); the limit is {codec.MAX_BODY_BYTES}")
        return body

    def decode_body(self, raw: bytes) -> Any:
        """The body's data; :class:`PayloadCodecError` when this chain cannot decode it (or,
        for a composed chord callback, one of its parts)."""
        parts = composed_parts(raw)
        if parts is not None:
            results, extra = parts
            return {"results": [self.decode_body(r) for r in results],
                    "input": self.decode_body(extra)}
        names, payload = envelope(raw)
        if (names or []) != self.names:
            have = ", ".join(self.names) or "no codecs"
            need = ", ".join(names) if names is not None else "no codecs (a plain body)"
            raise PayloadCodecError(f"body encoded with {need}; this reader has {have}")
        if names is None:
            return codec.decode_body(raw)
        for c in reversed(self.codecs):
            payload = c.decode(payload)
        try:
            return codec.decode_body(payload)
        except Exception as exc:  # msgpack raises several unrelated types
            raise PayloadCodecError(f"body decoded by {', '.join(names)} is not msgpack: "
                                    f"{exc}") from None


def seal(names: list[str], payload: bytes) -> bytes:
    """The envelope of ``payload`` encoded by the codecs ``names`` (in the order applied)."""
    return msgpack.packb(msgpack.ExtType(ENVELOPE_EXT, msgpack.packb([names, payload])))


def envelope(raw: bytes) -> tuple[list[str] | None, bytes]:
    """``(codec names, payload)`` of an encoded body; ``(None, raw)`` for a plain one.
    Raises :class:`PayloadCodecError` for a malformed envelope."""
    if not raw or raw[0] not in (0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8):
        return None, raw  # not a msgpack extension value: a plain body
    try:
        value = codec.decode_body(raw)
    except Exception:
        return None, raw
    if not isinstance(value, msgpack.ExtType) or value.code != ENVELOPE_EXT:
        return None, raw
    try:
        names, payload = msgpack.unpackb(value.data, raw=False)
    except Exception as exc:
        raise PayloadCodecError(f"malformed codec envelope: {exc}") from None
    if not (isinstance(names, list) and 0 < len(names) <= MAX_ENVELOPE_CODECS
            and all(isinstance(n, str) for n in names) and isinstance(payload, bytes)):
        raise PayloadCodecError("malformed codec envelope")
    return names, payload


def describe(raw: bytes) -> str | None:
    """How an operator view shows an encoded body (``"encoded: zlib, aes-gcm (312 bytes)"``);
    None for a plain one."""
    try:
        parts = composed_parts(raw)
        if parts is not None:
            inner = sorted({describe_names(p) for p in [*parts[0], parts[1]]})
            return f"encoded: chord callback of {len(parts[0])} results ({'; '.join(inner)}) " \
                   f"({len(raw)} bytes)"
        names, _ = envelope(raw)
    except PayloadCodecError:
        return f"malformed encoded body ({len(raw)} bytes)"
    return None if names is None else f"encoded: {', '.join(names)} ({len(raw)} bytes)"


def describe_names(raw: bytes) -> str:
    """The codecs one body is encoded with (``"zlib, aes-gcm"``, or ``"plain"``)."""
    names, _ = envelope(raw)
    return ", ".join(names) if names is not None else "plain"


def is_encoded(raw: bytes) -> bool:
    """Whether ``raw`` is a body encoded by codecs (an envelope or a composed callback);
    never raises."""
    try:
        return composed_parts(raw) is not None or envelope(raw)[0] is not None
    except PayloadCodecError:
        return True  # malformed, but meant as encoded: not a plain body either


# -- chord callbacks ----------------------------------------------------------------------------
def compose(results: list[bytes], extra: Any) -> Encoded | None:
    """A chord callback's body ``{"results": [...], "input": extra}`` built from its members'
    results as the workers sent them, without decoding any (the owner holds no codecs): a
    composed body when a result or ``extra`` (bytes from :meth:`CodecChain.encode_body`) is
    encoded, which a worker's chain decodes part by part; None when all are plain (the caller
    builds an ordinary body). Raises :class:`InvalidJob` past the body limit."""
    extra_raw = bytes(extra) if isinstance(extra, bytes) and is_encoded(extra) else None
    if extra_raw is None and not any(is_encoded(r) for r in results):
        return None
    if extra_raw is None:
        extra_raw = codec.encode_body(extra)
    body = msgpack.packb(msgpack.ExtType(COMPOSED_EXT, msgpack.packb(
        [list(results), extra_raw], use_bin_type=True)), use_bin_type=True)
    if len(body) > codec.MAX_BODY_BYTES:
        raise InvalidJob(f"chord callback body is {len(body)} bytes; the limit is "
                         f"{codec.MAX_BODY_BYTES}")
    return Encoded(body)


def composed_parts(raw: bytes) -> tuple[list[bytes], bytes] | None:
    """``(results, input)`` of a composed chord callback body, each an encoded body; None for
    any other body. Raises :class:`PayloadCodecError` for a malformed one."""
    if not raw or raw[0] not in (0xC7, 0xC8, 0xC9, 0xD4, 0xD5, 0xD6, 0xD7, 0xD8):
        return None
    try:
        value = codec.decode_body(raw)
    except Exception:
        return None
    if not isinstance(value, msgpack.ExtType) or value.code != COMPOSED_EXT:
        return None
    try:
        results, extra = msgpack.unpackb(value.data, raw=False)
    except Exception as exc:
        raise PayloadCodecError(f"malformed chord callback body: {exc}") from None
    if not (isinstance(results, list) and len(results) <= MAX_COMPOSED_PARTS
            and all(isinstance(r, bytes) for r in results) and isinstance(extra, bytes)):
        raise PayloadCodecError("malformed chord callback body")
    return results, extra
