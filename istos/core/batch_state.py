"""PURE: one batch's barrier as its home owner keeps it, and the proof its members carry.

A batch is an open group of jobs on any queues. Its *home* owner (the owner of one queue the
creator names) keeps this :class:`BatchHeader`: how many members were added, how many ended
and how, whether the batch is closed, and which callbacks went out. Each member's own owner
reports the member's end (``done``, ``dead``, ``cancelled``) to the home owner, at least once;
a report is idempotent by member, because the home owner stores each member's last outcome next
to the header and writes both in one atomic step (``owner/extensions/batches_ext.py``).

**Proof.** The creator picks a random ``key``; the batch id is ``wf:`` + 32 hex digits of
``sha256("batch", key, home)`` + ``@`` + the home queue's name (so the id alone finds its
home). Adding a member, reporting one, closing the batch and accepting its callbacks all need
the key, which only the creator, the home owner and the
members' claimers hold (reads strip it, ``workflow_meta.public_meta``): an id read from an
event or a job listing proves nothing.

**Transitions of a member.** ``pending`` → ``done`` | ``dead`` | ``cancelled``, and ``dead``
→ ``done`` (a dead member revived with ``app.revive`` that then succeeds). ``done`` is final:
a member's handler succeeded once the home counted it done (its report goes out before its
ack), so a later ``dead`` (the ack came too late, the job ran again and died) or
``cancelled`` changes nothing: delivery is at least once, and ``on_success`` never fires for a
batch that then counts a death.
Every other report changes nothing (a repeat, or a late report of an older attempt).

**Nesting.** A child batch is one member of its parent: its header holds the parent's proof
(``parent``: ``{id, home, key}``), and once the child is closed and no member of it is pending
its home reports the child's outcome (:meth:`BatchHeader.outcome`) to the parent's home like a
member's end, again whenever that outcome changes (a dead member requeued, then done).

**When callbacks are due** (:meth:`BatchHeader.due`), each at most once, only once closed:
``on_death`` when at least one member is dead; ``on_complete`` when no member is pending;
``on_success`` when every member is done.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError, InvalidJob
from .config import check_queue_name
from .workflow_meta import WORKFLOW_PREFIX, check_key

PENDING, DONE, DEAD, CANCELLED = "pending", "done", "dead", "cancelled"
OUTCOMES = (DONE, DEAD, CANCELLED)
KINDS = ("on_death", "on_complete", "on_success")  # the order in which due callbacks fire
MEMBER_KEYS = ("id", "home", "key")
CALLBACK_KEYS = ("id", "home", "kind", "key")
# No move leaves DONE: the handler did succeed (a done report goes out only from the ack of
# a run that returned), whatever happens to a later delivery of the same job.
_MOVES = {(PENDING, DONE), (PENDING, DEAD), (PENDING, CANCELLED), (DEAD, DONE)}


def is_move(old: str, new: str) -> bool:
    """Whether an outcome moving ``old`` -> ``new`` counts (the transitions above); dependencies
    (``deps.py``) move their parents' outcomes by the same rules."""
    return (old, new) in _MOVES


def batch_id(key: str, home: str) -> str:
    """The id of the batch created with ``key`` whose home is queue ``home``."""
    raw = json.dumps(["batch", key, home], separators=(",", ":"), ensure_ascii=True)
    return f"{WORKFLOW_PREFIX}{hashlib.sha256(raw.encode()).hexdigest()[:32]}@{home}"


def home_of(bid: str) -> str:
    """The home queue a batch id names. Raises :class:`~istos.errors.ConfigError` for a string
    that is not a batch id."""
    head, sep, home = bid.partition("@") if isinstance(bid, str) else ("", "", "")
    if not sep or not head.startswith(WORKFLOW_PREFIX) or len(head) != len(WORKFLOW_PREFIX) + 32:
        raise ConfigError(f"{str(bid)[:80]!r} is not a batch id ('wf:<32 hex>@<home queue>')")
    return check_queue_name(home)


def check_proof(what: str, bid: Any, key: Any, home: str) -> str:
    """Raise :class:`InvalidJob` unless ``bid`` is the id of a batch made with ``key`` whose
    home is ``home``; returns the key."""
    checked = check_key(what, key)
    if not isinstance(bid, str) or bid != batch_id(checked, home):
        raise InvalidJob(f"{what}: {str(bid)[:60]!r} is not the id of a batch made with that "
                         f"key whose home is queue {home!r} (batches come from app.batch)")
    return checked


def check_member_meta(queue: str, job_id: str, entry: Any) -> dict[str, Any]:
    """Check the ``batch`` entry of a member's meta (``{id, home, key}``); returns it."""
    _shape(job_id, entry, MEMBER_KEYS)
    _queue(job_id, entry["home"])
    check_proof(f"job {job_id!r}", entry["id"], entry["key"], entry["home"])
    return entry  # type: ignore[no-any-return]


def check_callback_meta(queue: str, job_id: str, entry: Any) -> dict[str, Any]:
    """Check the ``batch_cb`` entry of a callback's meta (``{id, home, kind, key}``): the proof,
    and the job id ``'<batch id>.<kind>'``; returns it."""
    _shape(job_id, entry, CALLBACK_KEYS)
    _queue(job_id, entry["home"])
    if entry["kind"] not in KINDS:
        raise InvalidJob(f"job {job_id!r}: a batch callback's kind is one of {KINDS}")
    check_proof(f"job {job_id!r}", entry["id"], entry["key"], entry["home"])
    if job_id != callback_job_id(entry["id"], entry["kind"]):
        raise InvalidJob(f"job {job_id!r}: a batch callback's id is '<batch id>.<kind>'")
    return entry  # type: ignore[no-any-return]


def check_parent(entry: Any) -> dict[str, Any]:
    """Check a child batch's ``parent_batch`` (``{id, home, key}``: the parent's proof);
    returns it. Raises :class:`InvalidJob`."""
    _shape("parent_batch", entry, MEMBER_KEYS)
    _queue("parent_batch", entry["home"])
    check_proof("parent_batch", entry["id"], entry["key"], entry["home"])
    return entry  # type: ignore[no-any-return]


def callback_job_id(bid: str, kind: str) -> str:
    """The job id of batch ``bid``'s callback ``kind`` (deterministic: a repeat is a no-op)."""
    return f"{bid}.{kind}"


def _shape(job_id: str, value: Any, keys: tuple[str, ...]) -> None:
    if not isinstance(value, dict) or set(value) != set(keys):
        raise InvalidJob(f"job {job_id!r}: batch meta must be a map of exactly "
                         f"{', '.join(keys)}")


def _queue(job_id: str, name: Any) -> None:
    try:
        check_queue_name(name)
    except ValueError as exc:
        raise InvalidJob(f"job {job_id!r}: batch home: {exc}") from None


@dataclass
class BatchHeader:
    """One batch at its home owner: its callbacks, counts and fired callbacks.

    ``callbacks`` maps a kind (``on_success``, ...) to ``(queue, encoded input)``.
    ``fired`` maps a kind to the home clock's time it went out.
    """

    callbacks: dict[str, tuple[str, bytes]]
    description: str = ""
    created_at: float = 0.0
    closed: bool = False
    total: int = 0
    done: int = 0
    dead: int = 0
    cancelled: int = 0
    fired: dict[str, float] = field(default_factory=dict)
    # Callbacks decided and not recorded fired yet: kind -> the counts they carry. Stored
    # before the enqueue goes out (no lock is held across it); a restart sends them again
    # (the callback's job id makes a repeat a no-op).
    firing: dict[str, dict[str, int]] = field(default_factory=dict)
    finished_at: float | None = None  # when no member was pending any more, once closed
    parent: dict[str, Any] | None = None  # a child batch's parent proof {id, home, key}
    parent_told: str | None = None  # the outcome the parent's home last counted

    def outcome(self) -> str | None:
        """The batch's end as a member of its parent: None while open or pending; ``done``
        when every member is done, ``dead`` when one is dead, else ``cancelled``."""
        if not self.closed or self.pending:
            return None
        return DONE if self.done == self.total else DEAD if self.dead else CANCELLED

    def to_send(self) -> list[str]:
        """The callbacks decided (:attr:`firing`) and not recorded fired, in firing order."""
        return [kind for kind in KINDS if kind in self.firing and kind not in self.fired]

    def owes_work(self) -> bool:
        """Whether a callback is due or decided and unsent, or the parent is owed a report."""
        return bool(self.due() or self.to_send() or self.owes_parent())

    def owes_parent(self) -> bool:
        """Whether the parent's home has not counted this child's current outcome yet."""
        return self.parent is not None and self.outcome() not in (None, self.parent_told)

    @property
    def pending(self) -> int:
        """Members added and not ended yet."""
        return self.total - self.done - self.dead - self.cancelled

    def apply(self, old: str | None, new: str) -> bool:
        """Count member moving ``old`` → ``new`` (``old`` None: a member just added, ``new``
        then ``pending``). Returns False, changing nothing, for a move that is not one."""
        if old is None:
            if new != PENDING:
                return False
            self.total += 1
            return True
        if (old, new) not in _MOVES:
            return False
        for outcome, step in ((old, -1), (new, 1)):
            if outcome != PENDING:
                setattr(self, outcome, getattr(self, outcome) + step)
        return True

    def due(self) -> list[str]:
        """The callbacks due now and neither fired nor decided yet (:attr:`firing`), in firing
        order (none before close)."""
        if not self.closed:
            return []
        out = []
        for kind in KINDS:
            if kind not in self.callbacks or kind in self.fired or kind in self.firing:
                continue
            if kind == "on_death" and self.dead > 0 \
                    or kind == "on_complete" and self.pending == 0 \
                    or kind == "on_success" and self.pending == 0 and self.done == self.total:
                out.append(kind)
        return out

    def counts(self) -> dict[str, int]:
        """total, pending, done, dead and cancelled."""
        return {"total": self.total, "pending": self.pending, "done": self.done,
                "dead": self.dead, "cancelled": self.cancelled}

    def status(self, bid: str, home: str) -> dict[str, Any]:
        """What ``batch_status`` answers (never the key)."""
        return {"batch_id": bid, "home": home, "description": self.description,
                "closed": self.closed, **self.counts(), "created_at": self.created_at,
                "finished_at": self.finished_at,
                "parent_id": None if self.parent is None else self.parent["id"],
                "callbacks": {kind: {"queue": q, "fired_at": self.fired.get(kind)}
                              for kind, (q, _) in self.callbacks.items()}}

    def encode(self) -> dict[str, Any]:
        return {"callbacks": {k: [q, b] for k, (q, b) in self.callbacks.items()},
                "description": self.description, "created_at": self.created_at,
                "closed": self.closed, "total": self.total, "done": self.done,
                "dead": self.dead, "cancelled": self.cancelled, "fired": self.fired,
                "firing": self.firing,
                "finished_at": self.finished_at, "parent": self.parent,
                "parent_told": self.parent_told}

    @classmethod
    def decode(cls, d: dict[str, Any]) -> BatchHeader:
        return cls(callbacks={str(k): (str(v[0]), bytes(v[1]))
                              for k, v in d["callbacks"].items()},
                   description=str(d.get("description", "")),
                   created_at=float(d.get("created_at", 0.0)), closed=bool(d["closed"]),
                   total=int(d["total"]), done=int(d["done"]), dead=int(d["dead"]),
                   cancelled=int(d["cancelled"]),
                   fired={str(k): float(v) for k, v in d.get("fired", {}).items()},
                   firing={str(k): {str(c): int(n) for c, n in v.items()}
                           for k, v in d.get("firing", {}).items()},
                   finished_at=d.get("finished_at"), parent=d.get("parent"),
                   parent_told=d.get("parent_told"))
