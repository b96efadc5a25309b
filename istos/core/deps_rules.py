"""PURE: the verdict on a waiting child, from its parents' outcomes (``deps.py`` has the rest).

Kept apart from ``deps.py`` (which checks queue names, through ``config.py``, which imports
``state.py``) so that ``state.py`` can ask whether a new record waits without an import circle.
"""

from __future__ import annotations

from typing import Any, Literal

META = "deps"  # the entry of a child's meta
PENDING, DONE, DEAD, CANCELLED = "pending", "done", "dead", "cancelled"
FAILED = (DEAD, CANCELLED)

Verdict = Literal["wait", "release", "cancel"]


def verdict(entry: dict[str, Any]) -> Verdict:
    """What the child does now, given its parents' outcomes (``o``) and ``mode``: ``release``
    when every parent is done, or (``run``) when none is pending; ``cancel`` (``cancel``) as
    soon as one is dead or cancelled; else ``wait`` (with ``wait`` and a failed parent: until
    an operator acts)."""
    outcomes = entry["o"]
    if all(o == DONE for o in outcomes):
        return "release"
    mode = entry["mode"]
    if mode == "cancel" and any(o in FAILED for o in outcomes):
        return "cancel"
    if mode == "run" and PENDING not in outcomes:
        return "release"
    return "wait"


def waits(meta: dict[str, Any] | None) -> bool:
    """Whether a new record with ``meta`` starts ``waiting`` (a deps entry that does not
    decide yet)."""
    return meta is not None and META in meta and verdict(meta[META]) == "wait"
