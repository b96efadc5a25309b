"""Large bodies: a payload codec that keeps bodies over a threshold in an object store and
sends a reference (``Istos(codecs=[..., OffloadCodec(store)])``), and the owner-side janitor
that deletes a job's objects once its owner forgot the job.

The codec is the last of a chain, so the store holds what the codecs before it made (the
ciphertext, with ``AesGcmCodec`` before it). Its output is one tag byte and either the bytes
themselves (``0x00``, at most ``threshold_bytes``) or an object key (``0x01``): the envelope
on the wire stays small, and the 1 MiB body cap is unchanged. A body may be as large as
``max_body_bytes`` before the codecs run.

Stores implement :class:`ObjectStore` (``put``/``get``/``delete`` of bytes by key):
:class:`DirectoryStore` (a filesystem directory, local or shared) here, and
:class:`FsspecStore` (any fsspec URL: ``s3://bucket/prefix``, ``gs://...``, ``memory://``)
when ``fsspec`` is installed. A store that fails a ``put`` raises
:class:`~istos.errors.OffloadUnavailable` from ``enqueue``, before anything is sent; one that
fails a ``get`` fails the worker's attempt with it (retried like any failure).

Lifecycle: objects are written by whoever encodes (the producer for bodies, the worker for
results); the owner holds only references. :class:`OffloadJanitor`, installed on the app
that owns the queue (``OffloadJanitor(store).install(owner_app)``), deletes a job's objects
(its body's and its kept result's) when the owner forgets the job: acked on a queue without
``keep_results``, its result expired, purged from the dead letters, a cancelled job expired.
It learns the references from the owner's records (events after their write), so it deletes
only after the forgetting write succeeded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from . import events as ev
from .errors import ConfigError, OffloadUnavailable, PayloadCodecError
from .payload import envelope

log = logging.getLogger("istos.offload")

INLINE, OFFLOADED = b"\x00", b"\x01"
DEFAULT_THRESHOLD = 256 << 10
DEFAULT_MAX_BODY = 256 << 20
_KEY_CHARS = frozenset("0123456789abcdef")
FORGETTING = frozenset({ev.ACKED, ev.RESULT_EXPIRED, ev.PURGED})
"""Events after which the owner may no longer hold the job (checked against its state)."""


@runtime_checkable
class ObjectStore(Protocol):
    """Where large bodies go: bytes by key. Each method raises (any exception) when the store
    cannot do it; ``get`` of a missing key raises too, ``delete`` of one does not."""

    def put(self, key: str, data: bytes) -> None: ...

    def get(self, key: str) -> bytes: ...

    def delete(self, key: str) -> None: ...


class DirectoryStore:
    """Objects as files of one directory (created if missing; on a shared filesystem for
    producers and workers on several machines). Writes go to a temporary name first, then
    are renamed: a reader never sees half an object."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def _file(self, key: str) -> Path:
        return self.path / key

    def put(self, key: str, data: bytes) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / f".{key}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self._file(key))

    def get(self, key: str) -> bytes:
        return self._file(key).read_bytes()

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._file(key).unlink()


class FsspecStore:
    """Objects under an fsspec URL prefix (``s3://bucket/istos``: needs ``fsspec`` and the
    protocol's package, such as ``s3fs``); ``options`` go to the filesystem. Raises
    :class:`ConfigError` when ``fsspec`` is missing."""

    def __init__(self, url: str, **options: Any) -> None:
        try:
            import fsspec
        except ImportError as exc:
            raise ConfigError("FsspecStore needs fsspec: pip install fsspec") from exc
        self.fs, self.root = fsspec.core.url_to_fs(url, **options)
        self.root = self.root.rstrip("/")

    def put(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(f"{self.root}/{key}", data)

    def get(self, key: str) -> bytes:
        return bytes(self.fs.cat_file(f"{self.root}/{key}"))

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm_file(f"{self.root}/{key}")


class OffloadCodec:
    """A payload codec that puts a body over ``threshold_bytes`` (as the codecs before it
    made it) into ``store`` and sends its key instead; smaller bodies travel inline. Must be
    the chain's last codec. ``max_body_bytes`` bounds a body before the codecs (msgpack).
    Raises :class:`ConfigError` for a store without put/get/delete or bad sizes; encoding
    raises :class:`OffloadUnavailable` when the store fails, decoding that or
    :class:`PayloadCodecError` for a malformed reference."""

    name = "offload"

    def __init__(self, store: ObjectStore, *, threshold_bytes: int = DEFAULT_THRESHOLD,
                 max_body_bytes: int = DEFAULT_MAX_BODY) -> None:
        if not isinstance(store, ObjectStore):
            raise ConfigError(f"OffloadCodec: {store!r} is not an object store (put, get, "
                              "delete)")
        for what, value in (("threshold_bytes", threshold_bytes),
                            ("max_body_bytes", max_body_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"OffloadCodec: {what} must be an integer >= 1, got "
                                  f"{value!r}")
        self.store = store
        self.threshold_bytes = threshold_bytes
        self.max_body_bytes = max_body_bytes

    def encode(self, data: bytes) -> bytes:
        if len(data) <= self.threshold_bytes:
            return INLINE + data
        key = secrets.token_hex(16)
        try:
            self.store.put(key, data)
        except Exception as exc:  # noqa: BLE001 - whatever the store raises
            raise OffloadUnavailable(f"offload: storing a {len(data)}-byte body failed: "
                                     f"{type(exc).__name__}: {exc}") from exc
        return OFFLOADED + key.encode()

    def decode(self, data: bytes) -> bytes:
        if data[:1] == INLINE:
            return data[1:]
        key = reference_key(data)
        try:
            return self.store.get(key)
        except Exception as exc:  # noqa: BLE001
            raise OffloadUnavailable(f"offload: reading body {key} failed: "
                                     f"{type(exc).__name__}: {exc}") from exc


def reference_key(data: bytes) -> str:
    """The object key of an offload codec's output that is a reference;
    :class:`PayloadCodecError` for anything else."""
    key = data[1:].decode("ascii", errors="replace")
    if data[:1] != OFFLOADED or len(key) != 32 or not _KEY_CHARS.issuperset(key):
        raise PayloadCodecError("offload: malformed body reference")
    return key


def referenced_key(raw: bytes | None) -> str | None:
    """The object key a stored body (or result) refers to, None if it holds none; read from
    its envelope without any codec (the reference sits outside the others). Never raises."""
    if not raw:
        return None
    try:
        names, payload = envelope(raw)
        if not names or names[-1] != OffloadCodec.name or payload[:1] != OFFLOADED:
            return None
        return reference_key(payload)
    except PayloadCodecError:
        return None


class OffloadJanitor:
    """Deletes the objects of the jobs an app's owners forget (see the module doc). Install
    it on the app that owns the queues (:meth:`install`), with the store the producers and
    workers write to; it keeps one entry per held job that has objects."""

    def __init__(self, store: ObjectStore) -> None:
        if not isinstance(store, ObjectStore):
            raise ConfigError(f"OffloadJanitor: {store!r} is not an object store")
        self.store = store
        self._keys: dict[tuple[str, str], set[str]] = {}
        self._scanned: set[int] = set()  # ids of the owner objects already indexed
        self._owners: Any = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.deleted = 0

    def install(self, app: Any) -> OffloadJanitor:
        """Watch ``app``'s owners (their events); returns self. Never raises."""
        self._owners = app.owners
        app.events.subscribe(self._on_event)
        return self

    def _owner_state(self, queue: str) -> Any:
        owner = self._owners.get(queue) if self._owners is not None else None
        if owner is None:
            return None
        if id(owner) not in self._scanned:  # a (re)started owner: index what it recovered
            self._scanned.add(id(owner))
            for rec in owner.state.jobs.values():
                self._note(queue, rec)
        return owner.state

    def _note(self, queue: str, rec: Any) -> None:
        for raw in (rec.body, rec.result):
            key = referenced_key(raw)
            if key is not None:
                self._keys.setdefault((queue, rec.job_id), set()).add(key)

    def _on_event(self, event: ev.JobEvent) -> None:
        try:
            state = self._owner_state(event.queue)
            if state is None or not event.job_id:
                return
            rec = state.jobs.get(event.job_id)
            if rec is not None:
                if event.kind in (ev.ENQUEUED, ev.ACKED):  # its body; a kept result
                    self._note(event.queue, rec)
                return
            if event.kind in FORGETTING or event.kind == ev.ACKED:
                keys = self._keys.pop((event.queue, event.job_id), None)
                if keys:
                    self._delete(keys)
        except Exception:  # noqa: BLE001 - a janitor's slip never touches the owner
            log.warning("offload janitor: event %s of %s failed", event.kind, event.job_id,
                        exc_info=True)

    def _delete(self, keys: set[str]) -> None:
        task = asyncio.get_running_loop().create_task(self._delete_off_loop(keys))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delete_off_loop(self, keys: set[str]) -> None:
        for key in keys:
            try:  # a remote store may be slow: never on the loop
                await asyncio.to_thread(self.store.delete, key)
                self.deleted += 1
            except Exception as exc:  # noqa: BLE001
                log.warning("offload janitor: deleting object %s failed: %s", key, exc)

    async def drain(self) -> None:
        """Wait for the deletions started so far (tests, shutdown). Never raises."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
