"""PURE: a queue's pauses, as stored: the whole queue's, and one per paused fairness group.

A pause says who asked for it (``by``, as the caller named itself), why (``reason``) and when
(``at``, the owner's wall clock). The owner keeps them in their own storage namespace, written
before memory changes (``owner/persistence/pause_store.py``), so a restarted owner or a newly
elected HA leader starts paused. This module is the record and the set of them, with their wire
shapes; it does no I/O.

Storage keys: :data:`QUEUE_KEY` for the whole queue, ``group:{name}`` for a group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgpack

from ..protocol import MAX_GROUP_BYTES, MAX_PAUSE_BY_BYTES, MAX_PAUSE_REASON_BYTES

__all__ = ["QUEUE_KEY", "Pause", "Pauses", "pause_key"]

QUEUE_KEY = "queue"
_GROUP_PREFIX = "group:"


def pause_key(group: str | None) -> str:
    """The storage key of the pause of ``group`` (None: the whole queue)."""
    return QUEUE_KEY if group is None else _GROUP_PREFIX + group


@dataclass(frozen=True, slots=True)
class Pause:
    """One pause: of the whole queue (``group`` None) or of one group."""

    at: float
    by: str | None = None
    reason: str | None = None
    group: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The pause as ``stats``, the ``pause`` reply and storage show it."""
        return {"at": self.at, "by": self.by, "reason": self.reason, "group": self.group}

    def encode(self) -> bytes:
        return msgpack.packb(self.to_dict(), use_bin_type=True)

    @classmethod
    def decode(cls, raw: bytes) -> Pause | None:
        """The stored pause, or None for bytes that are not one (a damaged entry is skipped
        rather than stopping the owner: it then serves unpaused, and says so in a log)."""
        try:
            d = msgpack.unpackb(raw, raw=False)
        except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError,
                msgpack.StackError):
            return None
        if type(d) is not dict:
            return None
        at, by, reason, group = d.get("at"), d.get("by"), d.get("reason"), d.get("group")
        if not isinstance(at, (int, float)) or isinstance(at, bool) \
                or not _text(by, MAX_PAUSE_BY_BYTES) or not _text(reason, MAX_PAUSE_REASON_BYTES) \
                or not _text(group, MAX_GROUP_BYTES) or group == "":
            return None
        return cls(float(at), by, reason, group)


def _text(value: Any, limit: int) -> bool:
    return value is None or (type(value) is str and len(value.encode("utf-8", "replace")) <= limit)


class Pauses:
    """The pauses one queue holds now: the whole queue's (or None) and each paused group's.

    ``groups`` is the set the claim path reads (:class:`~.groups.Groups` holds the same set
    object, so a change here is seen there without a copy).
    """

    def __init__(self, groups: set[str] | None = None) -> None:
        self.queue: Pause | None = None
        self.by_group: dict[str, Pause] = {}
        self.groups: set[str] = groups if groups is not None else set()

    def put(self, pause: Pause) -> None:
        if pause.group is None:
            self.queue = pause
        else:
            self.by_group[pause.group] = pause
            self.groups.add(pause.group)

    def drop(self, group: str | None) -> Pause | None:
        """Remove the pause of ``group`` (None: the queue's); the pause removed, if any."""
        if group is None:
            was, self.queue = self.queue, None
            return was
        self.groups.discard(group)
        return self.by_group.pop(group, None)

    def get(self, group: str | None) -> Pause | None:
        return self.queue if group is None else self.by_group.get(group)

    def stats(self, limit: int = 20) -> dict[str, Any]:
        """The fields ``stats`` adds: ``pause`` (the queue's, when paused) and, when groups are
        paused, ``paused_groups`` (how many, and the oldest ``limit`` of them)."""
        out: dict[str, Any] = {}
        if self.queue is not None:
            out["pause"] = self.queue.to_dict()
        if self.by_group:
            oldest = sorted(self.by_group.values(), key=lambda p: (p.at, p.group or ""))
            out["paused_groups"] = {"count": len(oldest),
                                    "groups": [p.to_dict() for p in oldest[:limit]]}
        return out
