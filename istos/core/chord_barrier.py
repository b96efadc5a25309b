"""A chord's barrier as its member queue's owner stores it (``features/workflow.py`` keeps it,
``owner/views/workflow_view.py`` reads it for ``why``).

One record per chord, in the owner's storage (namespace ``wf:{queue}``, key = chord id):
each member's result by index until the callback is enqueued, then a tombstone (the fired
flag, results dropped); ``dead`` lists the members dead-lettered while the barrier waits
(index -> when their owner recorded it), which stall the chord until revived, and
``cancelled`` the members cancelled while it waits, which stall it for good (a cancelled job
never runs again).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgpack


@dataclass
class Barrier:
    """One chord's progress: results by member index, the members stalling it, and whether
    the callback went out."""

    size: int
    results: dict[int, bytes] = field(default_factory=dict)
    fired: bool = False
    fired_at: float | None = None
    callback: str | None = None  # None: opened before barriers recorded their callback
    dead: dict[int, float] = field(default_factory=dict)  # member index -> recorded dead at
    cancelled: dict[int, float] = field(default_factory=dict)  # index -> recorded cancelled at

    def stalled_by(self) -> list[int]:
        """The dead and cancelled members whose result the barrier still lacks, in index
        order."""
        return sorted(i for i in {*self.dead, *self.cancelled} if i not in self.results)

    def ended_at(self, index: int) -> float:
        """When member ``index`` (one :meth:`stalled_by` lists) was recorded dead or
        cancelled."""
        return self.dead[index] if index in self.dead else self.cancelled[index]

    def encode(self) -> bytes:
        return msgpack.packb({"size": self.size, "results": self.results, "fired": self.fired,
                              "fired_at": self.fired_at, "callback": self.callback,
                              "dead": self.dead, "cancelled": self.cancelled},
                             use_bin_type=True)

    @classmethod
    def decode(cls, raw: bytes) -> Barrier:
        """The barrier stored as ``raw`` (one its owner wrote: storage is trusted). A record
        written before barriers listed dead (or cancelled) members reads as listing none."""
        d = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        return cls(size=int(d["size"]), results={int(k): v for k, v in d["results"].items()},
                   fired=bool(d["fired"]), fired_at=d.get("fired_at"),
                   callback=d.get("callback"),
                   dead={int(k): float(v) for k, v in (d.get("dead") or {}).items()},
                   cancelled={int(k): float(v)
                              for k, v in (d.get("cancelled") or {}).items()})
