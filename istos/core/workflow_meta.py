"""PURE: the shapes of job ``meta`` the workflow code writes, checked at enqueue.

Workflow meta makes the owner (chord callbacks) or a worker (chain continuations) enqueue
follow-up jobs, so an owner accepts only what :mod:`istos.features.workflow` itself writes;
anything else is refused with :class:`~istos.errors.InvalidJob` before it is stored.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError, InvalidJob
from .config import check_priority, check_queue_name

CHAIN_KEYS = ("id", "queues", "step", "priority")
CHORD_KEYS = ("id", "index", "size", "callback", "input")


def check_workflow_meta(queue: str, job_id: str, meta: dict[str, Any]) -> dict[str, Any] | None:
    """Check ``meta`` of job ``job_id`` enqueued on ``queue``; return the chord entry (whose
    barrier the caller still has to find), or None for a chain step."""
    if set(meta) == {"chain"}:
        check_chain_meta(queue, job_id, meta["chain"])
        return None
    if set(meta) != {"chord"}:
        raise InvalidJob(f"job {job_id!r}: meta must be a workflow's ({{'chain': ...}} or "
                         f"{{'chord': ...}}), got keys {sorted(map(str, meta))[:5]}")
    chord = meta["chord"]
    _check_shape(job_id, chord, CHORD_KEYS)
    size, index = chord["size"], chord["index"]
    if type(size) is not int or type(index) is not int or not 0 <= index < size:
        raise InvalidJob(f"job {job_id!r}: chord index/size must be integers with "
                         f"0 <= index < size, got {index!r}/{size!r}")
    if not isinstance(chord["id"], str) or job_id != f"{chord['id']}.{index}":
        raise InvalidJob(f"job {job_id!r}: a chord member's id is '<chord id>.<index>'")
    return chord  # type: ignore[no-any-return]


def _check_shape(job_id: str, value: Any, keys: tuple[str, ...]) -> None:
    if not isinstance(value, dict) or set(value) != set(keys):
        raise InvalidJob(f"job {job_id!r}: workflow meta must be a map of exactly "
                         f"{', '.join(keys)}")


def check_chain_meta(queue: str, job_id: str, step: Any) -> None:
    """The shape ``chain`` and its continuations write: ``{id, queues, step, priority}``, the
    job id ``'<id>.<step>'`` and this queue at ``queues[step]``."""
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
    if not isinstance(step["id"], str) or job_id != f"{step['id']}.{index}":
        raise InvalidJob(f"job {job_id!r}: a chain step's id is '<chain id>.<step>'")
