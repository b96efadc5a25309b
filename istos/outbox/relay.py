"""The outbox relay: committed outbox rows become jobs, once each.

One round is three short steps, each its own single-statement transaction, so no row lock is
ever held across a wait on the mesh (a stopped relay blocks nobody):

1. **Claim**: one ``UPDATE .. WHERE id IN (SELECT .. ORDER BY id LIMIT n FOR UPDATE SKIP
   LOCKED) RETURNING ..`` marks up to ``batch`` unclaimed (or lapsed) rows with this round's
   random claim token and a ``claimed_until`` of now + ``claim_s``, and commits. Concurrent
   relays skip each other's rows (PostgreSQL); SQLite has a single writer anyway.
2. **Send**: each queue's rows, in id order, as ``enqueue_many`` requests carrying the rows'
   job ids. A re-sent row is a no-op at the owner: while the job exists it holds the id, and
   the dedup window (the row's ``dedup_s``, else the relay's) keeps the id reserved after the
   job finished.
3. **Delete** the rows the owner accepted (``WHERE claim_token = this round's``); rows whose
   send failed are released at once for the next round.

A relay killed between 2 and 3 leaves its rows claimed until ``claimed_until``; then any relay
takes them again and re-sends them, which adds nothing. So every committed row becomes exactly
one job, as long as ``dedup_s`` outlasts the time from a send to its delete (``claim_s`` plus a
relay's restart). While no owner answers, rows simply wait in the table.

**Same database, one step.** When a queue's owner serves in the relay's own app and stores its
jobs in the very database that holds the outbox (``SQLAlchemyStorage`` on the same URL), steps 2
and 3 are one transaction: the owner's write of the new jobs' records also deletes their rows
(still claimed by this round), so no crash can leave a row and its job both behind, and the
dedup window is no longer what keeps a row from becoming two jobs. ``stats()['atomic']``
counts the rows moved that way.

The relay wakes on PostgreSQL's ``LISTEN`` (the writer's ``pg_notify`` is delivered when its
transaction commits), and polls every ``poll_s`` besides (lapsed claims send no notification);
on SQLite it polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

from .. import protocol
from ..cancel_guard import within
from ..client import batches
from ..core.config import check_queue_name
from ..errors import ConfigError, InvalidJob, IstosError, ProtocolError
from ..owner.handlers import bulk
from .store import OutboxRow, OutboxStore

if TYPE_CHECKING:
    from .sql import SQLOutboxStore
from .table import DEFAULT_TABLE

log = logging.getLogger("istos.outbox")


class OutboxRelay:
    """Move committed rows of an outbox into their queues, through ``app``'s mesh.

    ``app``: the serving :class:`~istos.Istos` whose mesh reaches the queues' owners (the
    owner's own app, or any node). ``source``: an SQLAlchemy async URL
    (``postgresql+asyncpg://..`` or ``sqlite+aiosqlite:///..``) of the database holding outbox
    ``table``, or an :class:`~istos.outbox.store.OutboxStore` (the simulator's
    :class:`~istos.outbox.store.MemoryOutbox`). ``queues``: only rows of these queues (None:
    every row). ``batch``: rows per claim. ``claim_s``: how long a claim holds before another
    relay may take the rows again (keep it well above a round's time). ``dedup_s``: the window
    sent with rows that name none. ``poll_s``: the idle poll (default 1 s with LISTEN on
    PostgreSQL, 0.1 s otherwise). :meth:`Istos.outbox_relay` registers it as a plugin that
    starts and stops with the app.

    Raises :class:`ConfigError` for a bad option or a URL of another dialect.
    """

    def __init__(self, app: Any, source: str | OutboxStore, *,  # noqa: PLR0913
                 table: str = DEFAULT_TABLE, queues: Iterable[str] | None = None,
                 batch: int = 500, claim_s: float = 30.0, dedup_s: float = 3600.0,
                 poll_s: float | None = None, op_timeout_s: float = 5.0) -> None:
        if not 1 <= batch <= 10_000:
            raise ConfigError(f"batch must be between 1 and 10000, got {batch!r}")
        if not claim_s > 0 or not op_timeout_s > 0 or not dedup_s >= claim_s:
            raise ConfigError("claim_s and op_timeout_s must be > 0 and dedup_s >= claim_s")
        if poll_s is not None and not poll_s > 0:
            raise ConfigError(f"poll_s must be > 0, got {poll_s!r}")
        if isinstance(queues, str):
            raise ConfigError(f"queues must be a list of queue names, got the string {queues!r}")
        for name in queues or ():
            check_queue_name(name)
        if isinstance(source, str):
            from .sql import SQLOutboxStore

            source = SQLOutboxStore(source, table, op_timeout_s=op_timeout_s)
        self.app = app
        self.store: OutboxStore = source
        self.queues = None if queues is None else sorted(set(queues))
        self.batch, self.claim_s, self.dedup_s = batch, claim_s, dedup_s
        self.poll_s = poll_s if poll_s is not None else source.default_poll_s
        self.sent = 0  # rows accepted by an owner and deleted, since start
        self.failures = 0  # rounds that ended in an error, since start
        self.refused = 0  # rows an owner refused by themselves (left in the table)
        self.atomic = 0  # rows whose job was stored in the same transaction as their delete
        self._refusing: set[int] = set()  # the current round's refused rows (left claimed)
        self._tasks: list[asyncio.Task[None]] = []
        self._wake = asyncio.Event()
        #: Test hook: awaited after the owner accepted a round's rows, before they are deleted.
        self.after_send: Callable[[list[str]], Awaitable[None]] | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self, app: Any = None) -> None:
        """Open the store (creating the table if missing) and start relaying; raises
        StorageUnavailable if the database cannot be reached."""
        await self.store.open()
        self._wake = asyncio.Event()  # bound to the running loop
        self._tasks = [asyncio.create_task(self._run()),
                       asyncio.create_task(self.store.listen(self._wake.set))]

    async def stop(self, app: Any = None) -> None:
        """Stop after the current round (rows it claimed but did not send are taken again
        when their claim lapses) and close the store; then raises what a relay task failed
        with, if one did (the LISTEN connection's)."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        # gather, not ``suppress(CancelledError)``: a cancel of this stop itself propagates.
        ended = await asyncio.gather(*tasks, return_exceptions=True)
        await self.store.close()
        for outcome in ended:
            if isinstance(outcome, Exception):
                raise outcome

    # -- the loop -------------------------------------------------------------------------------
    async def _run(self) -> None:
        backoff = 0.0
        while True:
            self._wake.clear()  # a commit from here on wakes the next wait
            try:
                claimed = await self.round()
                backoff = 0.0
            except Exception as exc:  # noqa: BLE001 - a relay outlives any one round's fault
                self.failures += 1
                backoff = min(max(2 * backoff, 0.05), 2.0)
                known = isinstance(exc, (IstosError, OSError))
                log.log(logging.WARNING if known else logging.ERROR,
                        "outbox relay: %s (retrying in %.2fs)", exc, backoff,
                        exc_info=not known)
                # not cut short by a commit: the fault is elsewhere
                await self.app.node.clock.sleep(backoff)
                continue
            if claimed < self.batch:
                with contextlib.suppress(asyncio.TimeoutError):
                    await within(self._wake.wait(),
                                 self.app.node.clock.to_loop_seconds(self.poll_s))

    async def round(self) -> int:
        """One claim-send-delete round; returns how many rows it claimed. Raises
        StorageUnavailable (the database) or the owner's error (its rows released)."""
        node = self.app.node
        token = node.ids.token()  # a fresh secret per round: only this round deletes its rows
        self._refusing = set()  # this round's rows the owner refused by themselves
        rows = await self.store.claim(token, node.clock.now(), self.claim_s, self.batch,
                                      self.queues)
        if not rows:
            return 0
        by_queue: dict[str, list[OutboxRow]] = {}
        for row in rows:
            by_queue.setdefault(row.queue, []).append(row)
        results = await asyncio.gather(*(self._send(q, rs, token)
                                         for q, rs in by_queue.items()))
        done = [i for ids, _ in results for i in ids]
        accepted = set(done)
        if done:
            if self.after_send is not None:
                await self.after_send([r.job_id for r in rows if r.id in accepted])
            await self.store.finish(done, token, delete=True)
            self.sent += len(done)
        failed = [r.id for r in rows if r.id not in accepted and r.id not in self._refusing]
        errors = [e for _, e in results if e is not None]
        if failed:
            await self.store.finish(failed, token, delete=False)
        if errors:
            raise errors[0]
        return len(rows)

    async def _send(self, queue: str, rows: list[OutboxRow], token: str
                    ) -> tuple[list[int], Exception | None]:
        """Send ``rows`` (one queue's, in id order); the ids accepted, and the error that
        stopped the rest (later rows are not sent past a failure, to keep their order)."""
        client = self.app.client(queue)
        same_db = self._same_database_owner(queue)
        rows, items = self._checked(queue, rows)
        done: list[int] = []
        for start, end in batches.spans(items):
            try:
                if same_db is not None:  # one transaction: the jobs' write deletes their rows
                    owner, sql = same_db
                    ids = [r.id for r in rows[start:end]]
                    created = await bulk.enqueue_many(owner, items[start:end],
                                                      also=[sql.delete_step(ids, token)])
                    self.atomic += len(ids) if any(created) else 0
                else:
                    await client.call("enqueue_many", items=items[start:end])
            except (InvalidJob, ProtocolError):
                ids, exc = await self._one_by_one(client, queue, rows[start:end],
                                                  items[start:end])
                done.extend(ids)
                if exc is not None:
                    return done, exc
                continue
            except IstosError as exc:
                return done, exc
            done.extend(r.id for r in rows[start:end])
        return done, None

    def _same_database_owner(self, queue: str) -> tuple[Any, SQLOutboxStore] | None:
        """The owner of ``queue`` and the outbox, if the owner serves in this app and stores
        its jobs in the outbox's own database (see the module doc: one transaction)."""
        from .sql import SQLOutboxStore

        owner = getattr(self.app, "owners", {}).get(queue)
        store = self.store
        if owner is None or not isinstance(store, SQLOutboxStore) or not owner.running \
                or not owner.durable:
            return None
        storage = owner.node.storage
        url = getattr(getattr(storage, "inner", storage), "url", None)
        return (owner, store) if isinstance(url, str) and store.same_database(url) else None

    def _checked(self, queue: str, rows: list[OutboxRow]
                 ) -> tuple[list[OutboxRow], list[dict[str, Any]]]:
        """The rows whose items pass the wire's own check, and their items. A row is input
        from outside (anything may write the table), and an owner in this process would take
        it unchecked; one that fails is refused here as the owner would refuse it."""
        kept, items = [], []
        for row in rows:
            item = self._item(row)
            try:
                protocol.enqueue_item(f"outbox row {row.id}", item)
            except (InvalidJob, ProtocolError) as exc:
                self._refuse(queue, row, exc)
                continue
            kept.append(row)
            items.append(item)
        return kept, items

    def _refuse(self, queue: str, row: OutboxRow, exc: Exception) -> None:
        self.refused += 1
        self._refusing.add(row.id)
        log.error("outbox: queue %r refuses row %d (job %.40r): %s; it stays in the table",
                  queue, row.id, row.job_id, exc)

    async def _one_by_one(self, client: Any, queue: str, rows: list[OutboxRow],
                          items: list[dict[str, Any]]) -> tuple[list[int], Exception | None]:
        """A batch refused whole (nothing stored): each row alone, so a row the owner refuses
        by itself (one written by something other than ``outbox.enqueue``) holds up no other:
        it is logged, counted in ``refused`` and left claimed in the table, to be tried again
        when its claim lapses. Returns the ids accepted and the error that stopped the rest."""
        done: list[int] = []
        for row, item in zip(rows, items):
            try:
                await client.call("enqueue", **item)
            except (InvalidJob, ProtocolError) as exc:
                self._refuse(queue, row, exc)
                continue
            except IstosError as exc:
                return done, exc
            done.append(row.id)
        return done, None

    def _item(self, row: OutboxRow) -> dict[str, Any]:
        """The ``enqueue_many`` item of a row: its delay counts from the row's creation."""
        item: dict[str, Any] = {"body": bytes(row.body), "job_id": row.job_id,
                                "dedup_s": row.dedup_s if row.dedup_s else self.dedup_s}
        left = row.created_at + row.delay_s - self.app.node.clock.now()
        if row.delay_s and left > 0:
            item["delay_s"] = float(left)
        if row.priority:
            item["priority"] = int(row.priority)
        if row.job_group is not None:
            item["group"] = row.job_group
        return item

    # -- observability --------------------------------------------------------------------------
    async def stats(self) -> dict[str, Any]:
        """``depth`` (rows waiting, claimed ones included), ``claimed``, ``oldest_age_s``
        (None when empty), and this relay's ``sent``, ``failures``, ``refused`` and ``atomic``
        (moved in the owner's own transaction: see the module doc) counts; raises
        StorageUnavailable if the database cannot answer."""
        out = await self.store.stats(self.app.node.clock.now())
        return {**out, "sent": self.sent, "failures": self.failures, "refused": self.refused,
                "atomic": self.atomic}
