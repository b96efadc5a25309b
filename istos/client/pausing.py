"""Pause and resume a queue, or one of its fairness groups: the caller's side.

Every caller (``Istos.pause``, the CLI's ``istos pause``, ``LiveQueue.pause``) checks its
arguments here before anything is sent, then sends one ``pause`` or ``resume`` request (admin
role). The owner stores the pause before claims see it (``istos/owner/persistence/pause_store.py``),
so it outlives the owner's process and an HA failover.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.config import check_group, check_queue_name
from ..errors import ConfigError
from ..protocol import MAX_PAUSE_BY_BYTES, MAX_PAUSE_REASON_BYTES
from .call import OwnerClient

__all__ = ["Pausing", "pause_fields", "resume_fields"]


def _text(field: str, value: object, limit: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{field} must be None or a string, got {type(value).__name__}")
    if len(value.encode("utf-8", "surrogatepass")) > limit:
        raise ConfigError(f"{field} is longer than {limit} bytes (UTF-8)")
    return value


def pause_fields(*, reason: object = None, by: object = None,
                 group: object = None) -> dict[str, Any]:
    """The ``pause`` request's fields; raises :class:`ConfigError` naming the bad one
    (``reason`` over 500 bytes, ``by`` over 200, a group that is empty or over 128)."""
    fields: dict[str, Any] = {}
    if (text := _text("reason", reason, MAX_PAUSE_REASON_BYTES)) is not None:
        fields["reason"] = text
    if (name := _text("by", by, MAX_PAUSE_BY_BYTES)) is not None:
        fields["by"] = name
    if (grp := check_group(group)) is not None:
        fields["group"] = grp
    return fields


def resume_fields(*, group: object = None) -> dict[str, Any]:
    """The ``resume`` request's fields; :class:`ConfigError` for a bad group."""
    grp = check_group(group)
    return {} if grp is None else {"group": grp}


class Pausing:
    """The app's pause and resume (``Istos.pause`` / ``Istos.resume``): one request each to
    the queue's owner, named as the app's node (``by``) unless the caller names someone."""

    def __init__(self, node_id: str, client: Callable[[str], OwnerClient],
                 require_serving: Callable[[], None]) -> None:
        self.node_id = node_id
        self.client = client
        self.require_serving = require_serving

    async def pause(self, name: str, *, reason: str | None = None, group: str | None = None,
                    by: str | None = None) -> dict[str, Any]:
        """Pause queue ``name`` (no claim gets a job; leases in flight carry on), or only its
        fairness group ``group``; returns the stored pause ``{"at", "by", "reason", "group"}``.

        The owner writes the pause to its storage before claims see it, so a restarted owner
        or a newly elected HA leader keeps the queue (or group) paused until :meth:`resume`.
        ``reason`` (up to 500 bytes) says why and ``by`` (up to 200; default: this app's node
        id) who; both show in ``stats``, ``istos stats``, the dashboard and events. Pausing
        again replaces ``by`` and ``reason`` and keeps the first pause's time.

        Raises, before sending: :class:`ConfigError` naming a bad ``reason``, ``by``,
        ``group`` or queue name. After: :class:`AdminDisabled` for a queue declared without
        ``admin=True``, :class:`StorageUnavailable` if the owner could not store it (nothing
        changed), :class:`CapacityExceeded` past 1,000 paused groups, :class:`OwnerUnavailable`
        if no owner answers, and :class:`IstosError` when the app is not serving.
        """
        check_queue_name(name)
        fields = pause_fields(reason=reason, by=self.node_id if by is None else by, group=group)
        self.require_serving()
        reply = await self.client(name).call("pause", **fields)
        return dict(reply.get("pause") or {})

    async def resume(self, name: str, *, group: str | None = None) -> bool:
        """Lift the pause of queue ``name`` (or of its group ``group``): the stored pause is
        deleted, then workers may claim again (the owner nudges them). Returns True when it
        was paused, False when there was nothing to lift (nothing written).

        Raises as :meth:`pause` does (``ConfigError`` for a bad ``group`` or queue name).
        """
        check_queue_name(name)
        fields = resume_fields(group=group)
        self.require_serving()
        reply = await self.client(name).call("resume", **fields)
        return reply.get("was") is not None
