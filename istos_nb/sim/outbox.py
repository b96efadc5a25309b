"""The application's database holding an outbox, in a simulation: it outlives every node.

Scenario transactions (``sim.outbox_transactions``) write rows into it and commit or roll
back; relays (``node.outbox_relay()``) read it through the relay's port; an outage
(``sim.outbox_outage``) makes it refuse relays and writers alike. Every row written is
recorded (job id, queue, committed) for the checker's outbox invariant (checker_outbox.py).
"""

from __future__ import annotations

from typing import Any, Protocol


class OutboxWorld(Protocol):
    """What the outbox asks of the world it lives in (:class:`~istos_nb.sim.world.World`)."""

    @property
    def loop(self) -> Any: ...

    def node_event(self, node: str, kind: str, job_id: str = "", **detail: Any) -> None: ...


class SimOutbox:
    """The outbox database of one simulated world, with the record the checker reads."""

    def __init__(self, world: OutboxWorld) -> None:
        self.world = world
        self.txns: list[dict[str, Any]] = []  # one row per outbox row written
        self.latency_s = 0.01  # each relay call's round trip to the database
        self._db: Any = None

    @property
    def db(self) -> Any:
        """The ``MemoryOutbox`` (made on first use: it needs SQLAlchemy installed)."""
        if self._db is None:
            from istos.outbox.store import MemoryOutbox

            self._db = MemoryOutbox(latency_s=self.latency_s)
        return self._db

    def set_available(self, available: bool) -> None:
        self.db.available = available
        self.world.node_event("outbox", "outbox_up" if available else "outbox_down")

    def transaction(self, queue: str, i: int, job_ids: list[str], commit: bool) -> None:
        """One application transaction: its rows, then commit or roll back (recorded)."""
        loop = self.world.loop
        assert loop is not None
        db, now = self.db, loop.time()
        committed = commit and db.available  # a database that is down commits nothing
        with db.transaction() as txn:
            for k, job_id in enumerate(job_ids):
                txn.enqueue(queue, {"txn": i, "row": k}, now=now, job_id=job_id)
            if not committed:
                txn.rollback()
        self.txns.extend({"job_id": j, "queue": queue, "committed": committed, "t": now}
                         for j in job_ids)

    def waiting(self) -> set[str]:
        """Job ids of the rows still in the outbox."""
        return set() if self._db is None else {h.row.job_id for h in self._db.rows.values()}
