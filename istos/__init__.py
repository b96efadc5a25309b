"""Istos: work queues over Eclipse Zenoh. See the docs (docs/index.md) and the wire protocol
(docs/protocol.md)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .app import Istos
from .clock import Clock, SystemClock
from .context import JobContext
from .di import Depends
from .errors import (
    AdminDisabled,
    CapacityExceeded,
    ConfigError,
    CronError,
    HAConfigError,
    InvalidJob,
    InvalidProgress,
    IstosError,
    JobCancelled,
    JobNotFound,
    JobTimeout,
    MeshUnreachable,
    NotAccepted,
    OwnerConflict,
    OwnerUnavailable,
    ParentFailed,
    ProtocolError,
    QueueNotFound,
    RemoteError,
    Retry,
    StorageUnavailable,
    UnsupportedOption,
)
from .events import JobEvent
from .lifecycle import Enqueued
from .storage.memory import MemoryStorage

if TYPE_CHECKING:  # loaded on first use (see __getattr__): they import Zenoh, SQLAlchemy
    from . import outbox
    from .sync_producer import SyncProducer

__all__ = [
    # the app and what workers receive
    "Istos",
    "SyncProducer",
    "JobContext",
    "Depends",
    # storage plugins
    "MemoryStorage",
    "RedisStoragePlugin",
    "SQLAlchemyStoragePlugin",
    # enqueue inside your own database transaction (the module: outbox.enqueue, ...)
    "outbox",
    # ports and events
    "Clock",
    "SystemClock",
    "JobEvent",
    "Enqueued",
    # errors
    "IstosError",
    "ConfigError",
    "CronError",
    "HAConfigError",
    "InvalidJob",
    "ParentFailed",
    "QueueNotFound",
    "JobNotFound",
    "OwnerUnavailable",
    "NotAccepted",
    "CapacityExceeded",
    "StorageUnavailable",
    "ProtocolError",
    "AdminDisabled",
    "RemoteError",
    "InvalidProgress",
    "JobTimeout",
    "MeshUnreachable",
    "OwnerConflict",
    "JobCancelled",
    "Retry",
    "UnsupportedOption",
]

__version__ = "0.1.0"

# A library logs; the application decides what to show (no output unless logging is set up).
logging.getLogger("istos").addHandler(logging.NullHandler())


def __getattr__(name: str) -> Any:
    # The durable plugins import optional packages, and the SyncProducer opens Zenoh: load
    # them only when asked for.
    if name == "SyncProducer":
        from .sync_producer import SyncProducer
        return SyncProducer
    if name == "RedisStoragePlugin":
        from .storage.redis import RedisStoragePlugin
        return RedisStoragePlugin
    if name == "outbox":
        import importlib
        return importlib.import_module(".outbox", __name__)
    if name == "SQLAlchemyStoragePlugin":
        from .storage.sqlalchemy import SQLAlchemyStoragePlugin
        return SQLAlchemyStoragePlugin
    raise AttributeError(f"module 'istos' has no attribute {name!r}")
