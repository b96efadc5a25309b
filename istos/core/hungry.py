"""PURE: which worker nodes an owner nudges when jobs become claimable.

A worker node whose claim came back with empty slots is *hungry*; a nudge wakes only as many
hungry nodes as there are new jobs (slots' worth), oldest hungry first, instead of every idle
worker. Claims carry a node id the owner cannot verify, so the tables are bounded and split:
nodes whose claims have returned jobs before are nudged first, the others only with what is
left. Idle claims from many made-up node ids then neither grow the owner's memory nor push
real workers out of the tables or take their nudges.
"""

from __future__ import annotations

MAX_HUNGRY = 1024  # idle nodes remembered per table; the oldest is forgotten past this
MAX_KNOWN_WORKERS = 1024  # nodes that have taken a job (only a claim that got jobs adds one)


class HungryNodes:
    """Idle worker nodes of one queue and the nudge targets they make."""

    def __init__(self) -> None:
        self.proven: dict[str, int] = {}  # node -> free slots, oldest hungry first
        self.unproven: dict[str, int] = {}
        self.known: dict[str, None] = {}  # nodes that have taken a job, in that order
        self.poked: set[str] = set()  # nudged at the next flush whatever the count

    def __len__(self) -> int:
        return len(self.proven) + len(self.unproven)

    def note_claim(self, node: str, free: int, *, took: bool, cut: bool) -> None:
        """Record one claim's outcome: ``free`` slots left empty, whether it ``took`` jobs, and
        whether the frame cap ``cut`` it short (then the node is poked to come back at once)."""
        self.proven.pop(node, None)
        self.unproven.pop(node, None)
        if took and node not in self.known:
            self.known[node] = None  # first seen working: the oldest is forgotten first
            if len(self.known) > MAX_KNOWN_WORKERS:
                del self.known[next(iter(self.known))]
        if free > 0:
            table = self.proven if node in self.known else self.unproven
            table[node] = free  # re-inserted: oldest hungry first
            if len(table) > MAX_HUNGRY:
                del table[next(iter(table))]
        if cut:
            self.poked.add(node)

    def take(self, count: int) -> set[str]:
        """The nodes to nudge for ``count`` new jobs (proven first), forgotten until their next
        claim comes back short; plus every poked node."""
        targets, self.poked = self.poked, set()
        for table in (self.proven, self.unproven):
            while count > 0 and table:
                node = next(iter(table))
                targets.add(node)
                count -= table.pop(node)
        return targets
