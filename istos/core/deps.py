"""PURE: a job that waits for others (``enqueue(..., after=[...])``) and the rules of its wait.

A *child* names its *parents* as ``(queue, job_id)`` pairs on any queues. It is stored at once
in state ``waiting`` with this entry in its meta, ``meta["deps"]``::

    {"after": [[queue, job_id], ...], "o": [outcome per parent], "mode": on_parent_failure,
     "key": the child's capability}

Each parent's outcome moves as a batch member's does (``batch_state.is_move``): ``pending`` ->
``done`` | ``dead`` | ``cancelled``, and ``dead`` -> ``done`` (a dead parent requeued with
``app.requeue_dead`` that then succeeds). Every other report changes nothing: reports are
at-least-once and idempotent by parent, and the record (meta and state in one write) goes
through its owner's write path.

**Verdict** (:func:`verdict`), by ``mode`` (``on_parent_failure``):

- every parent ``done``: ``release`` (the child becomes ready, in its queue's order);
- ``cancel`` (the default): ``cancel`` as soon as one parent is ``dead`` or ``cancelled``;
- ``run``: ``release`` once no parent is pending, whatever their outcomes;
- ``wait``: with a failed parent, ``wait`` until an operator acts (requeues the dead parent,
  promotes or cancels the child);
- else ``wait``.

**Proof.** The producer picks the ``key`` (random) at enqueue and hands it to each parent's
owner with the watch (``dep_watch``); a report (``dep_report``) counts only with it. Read ops
show the meta without it (``workflow_meta.public_meta``): an id read from a listing cannot
release a child.

Dependencies are one concept at three layers: these rules, the producer's half
(``client/deps.py``) and the app's wiring (``features/deps.py``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..errors import ConfigError, InvalidJob
from . import batch_state as bs
from .config import check_queue_name
from .deps_rules import CANCELLED, DEAD, DONE, FAILED, META, PENDING, Verdict, verdict

__all__ = ["CANCELLED", "DEAD", "DONE", "FAILED", "META", "PENDING", "Verdict", "verdict"]

MODES = ("cancel", "run", "wait")
DEFAULT_MODE = "cancel"
MAX_PARENTS = 64
"""Parents one child may name (the meta entry stays well under the meta size limit)."""
MAX_CHILDREN = 100_000
"""Children one pending parent may have watching it at its owner (``CapacityExceeded``)."""
OUTCOMES = bs.OUTCOMES
ENTRY_KEYS = frozenset({"after", "o", "mode", "key"})
KEY_CHARS = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_")


def check_refs(queue: str, job_id: str | None, after: Any) -> list[tuple[str, str]]:
    """The parents of a child about to be enqueued on ``queue`` as ``job_id``, as
    ``(queue, job_id)`` pairs: each a pair (or list) of a queue name and a job id, or an
    object with ``queue`` and ``job_id`` attributes. Repeats are dropped.

    Raises :class:`ConfigError` for an empty or over-long list (:data:`MAX_PARENTS`), a
    malformed ref, or the child naming itself.
    """
    if isinstance(after, (str, bytes)) or not hasattr(after, "__iter__"):
        raise ConfigError("after must be a list of (queue, job_id) pairs")
    out: list[tuple[str, str]] = []
    for ref in after:
        if hasattr(ref, "queue") and hasattr(ref, "job_id"):
            ref = (ref.queue, ref.job_id)
        if not isinstance(ref, (tuple, list)) or len(ref) != 2 \
                or not isinstance(ref[1], str) or not ref[1]:
            raise ConfigError(f"after: each parent is a (queue, job_id) pair, got {ref!r:.80}")
        pair = (check_queue_name(ref[0]), ref[1])
        if pair == (queue, job_id):
            raise ConfigError(f"after: job {job_id!r} cannot wait for itself")
        if pair not in out:
            out.append(pair)
    if not out:
        raise ConfigError("after: name at least one parent (or leave after out)")
    if len(out) > MAX_PARENTS:
        raise ConfigError(f"after: at most {MAX_PARENTS} parents, got {len(out)}")
    return out


def check_after(queue: str, job_id: str | None, after: Any, mode: Any, *, alone: bool
                ) -> list[tuple[str, str]] | None:
    """:func:`check_refs` and :func:`check_mode` of an enqueue's ``after`` and
    ``on_parent_failure`` (None: ``after`` is None, no parents); ``alone``: the enqueue has
    no unique key, debounce key, start deadline or workflow meta, which ``after`` does not
    combine with (:class:`ConfigError` otherwise)."""
    if after is None:
        return None
    parents = check_refs(queue, job_id, after)
    check_mode(mode)
    if not alone:
        raise ConfigError("after= does not combine with a unique key, a debounce key, a start "
                          "deadline or workflow meta")
    return parents


def check_mode(mode: Any) -> str:
    """``on_parent_failure``, one of :data:`MODES`; raises :class:`ConfigError` otherwise."""
    if mode not in MODES:
        raise ConfigError(f"on_parent_failure must be one of {MODES}, got {mode!r:.40}")
    return str(mode)


def check_entry(job_id: str, entry: Any) -> dict[str, Any]:
    """Check the ``deps`` entry of a child's meta as it comes from the wire; returns it.
    Raises :class:`InvalidJob` for any other shape."""
    if not isinstance(entry, dict) or set(entry) != ENTRY_KEYS:
        raise InvalidJob(f"job {job_id!r}: deps meta is a map of exactly "
                         f"{', '.join(sorted(ENTRY_KEYS))}")
    after, outcomes = entry["after"], entry["o"]
    if not isinstance(after, list) or not 0 < len(after) <= MAX_PARENTS \
            or not isinstance(outcomes, list) or len(outcomes) != len(after):
        raise InvalidJob(f"job {job_id!r}: deps.after lists 1-{MAX_PARENTS} parents, and "
                         "deps.o one outcome per parent")
    seen: set[tuple[str, str]] = set()
    for ref, outcome in zip(after, outcomes):
        if not isinstance(ref, list) or len(ref) != 2 or not isinstance(ref[1], str) \
                or not ref[1] or outcome not in (PENDING, *OUTCOMES):
            raise InvalidJob(f"job {job_id!r}: deps.after holds [queue, job_id] pairs and "
                             f"deps.o outcomes among {(PENDING, *OUTCOMES)}")
        try:
            check_queue_name(ref[0])
        except ValueError as exc:
            raise InvalidJob(f"job {job_id!r}: deps.after: {exc}") from None
        if (ref[0], ref[1]) in seen:
            raise InvalidJob(f"job {job_id!r}: deps.after names a parent twice")
        seen.add((ref[0], ref[1]))
    if entry["mode"] not in MODES:
        raise InvalidJob(f"job {job_id!r}: deps.mode is one of {MODES}")
    key = entry["key"]
    if not isinstance(key, str) or not 16 <= len(key) <= 64 or not KEY_CHARS.issuperset(key):
        raise InvalidJob(f"job {job_id!r}: deps.key is 16-64 characters of [A-Za-z0-9_-]")
    return entry


def with_outcome(entry: dict[str, Any], parent: tuple[str, str], outcome: str
                 ) -> dict[str, Any] | None:
    """A copy of ``entry`` with ``parent``'s outcome moved to ``outcome``; None when that is
    no move (a repeat, a late report, or a parent the child does not name)."""
    for i, ref in enumerate(entry["after"]):
        if (ref[0], ref[1]) == parent:
            if not bs.is_move(entry["o"][i], outcome):
                return None
            outcomes = list(entry["o"])
            outcomes[i] = outcome
            return {**entry, "o": outcomes}
    return None


def pending_parents(entry: dict[str, Any]) -> list[tuple[str, str]]:
    """The parents whose end has not reached the child yet."""
    return [(r[0], r[1]) for r, o in zip(entry["after"], entry["o"]) if o == PENDING]


def failure_text(entry: dict[str, Any]) -> str:
    """Why a child was cancelled (its ``last_error``): the first failed parent."""
    for ref, outcome in zip(entry["after"], entry["o"]):
        if outcome in FAILED:
            return f"parent {ref[1]} on queue {ref[0]} ended {outcome} (on_parent_failure=cancel)"
    return "a parent failed (on_parent_failure=cancel)"


def waits_for(entry: dict[str, Any]) -> dict[str, Any]:
    """What ``why`` shows of a child's wait: each parent and its outcome as reported, the
    mode, and whether it waits for an operator (``wait`` with a failed parent)."""
    parents = [{"queue": r[0], "job_id": r[1], "state": o}
               for r, o in zip(entry["after"], entry["o"])]
    stuck = entry["mode"] == "wait" and any(o in FAILED for o in entry["o"])
    return {"parents": parents, "on_parent_failure": entry["mode"],
            "pending": sum(1 for o in entry["o"] if o == PENDING),
            "needs_operator": stuck}


def watch_key(parent: str, child_queue: str, child_id: str) -> str:
    """The storage key of one child's watch of ``parent`` at the parent's owner."""
    raw = json.dumps([parent, child_queue, child_id], separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def outcome_of_state(state: str) -> str | None:
    """A parent's outcome for a child from its record's state (None: not ended). An expired
    parent (its start deadline passed) never ran: it counts as ``cancelled``."""
    return {"done": DONE, "dead": DEAD, "cancelled": CANCELLED, "expired": CANCELLED
            }.get(state)
