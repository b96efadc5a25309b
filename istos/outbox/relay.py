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

The relay wakes on PostgreSQL's ``LISTEN`` (the writer's ``pg_notify`` is delivered when its
transaction commits), and polls every ``poll_s`` besides (lapsed claims send no notification);
on SQLite it polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

from ..errors import ConfigError, InvalidJob, IstosError, ProtocolError, StorageUnavailable
from ..worker import batches
from .table import DEFAULT_TABLE, channel, outbox_table

log = logging.getLogger("istos.outbox")
T = TypeVar("T")
_COLUMNS = ("id", "queue", "job_id", "body", "delay_s", "priority", "dedup_s", "job_group",
            "created_at")


class OutboxRelay:
    """Move committed rows of outbox table ``table`` at database ``url`` into their queues.

    ``app``: the serving :class:`~istos.Istos` whose mesh reaches the queues' owners (the
    owner's own app, or any node). ``url``: an SQLAlchemy async URL
    (``postgresql+asyncpg://..`` or ``sqlite+aiosqlite:///..``). ``queues``: only rows of
    these queues (None: every row). ``batch``: rows per claim. ``claim_s``: how long a claim
    holds before another relay may take the rows again (keep it well above a round's time).
    ``dedup_s``: the window sent with rows that name none. ``poll_s``: the idle poll (default
    1 s with LISTEN on PostgreSQL, 0.1 s on SQLite). Start it with the app (it is a plugin:
    :meth:`Istos.outbox_relay` registers it), or ``await relay.start(app)`` / ``stop``.

    Raises :class:`ConfigError` for a bad option or a URL of another dialect.
    """

    def __init__(self, app: Any, url: str, *, table: str = DEFAULT_TABLE,  # noqa: PLR0913
                 queues: Iterable[str] | None = None, batch: int = 500,
                 claim_s: float = 30.0, dedup_s: float = 3600.0, poll_s: float | None = None,
                 op_timeout_s: float = 5.0) -> None:
        from sqlalchemy.engine import make_url

        self.app = app
        self.table = outbox_table(table)
        self.url = url
        backend = make_url(url).get_backend_name()
        if backend not in ("postgresql", "sqlite"):
            raise ConfigError(f"the outbox relay supports postgresql and sqlite, not {backend!r}")
        self._pg = backend == "postgresql"
        if not 1 <= batch <= 10_000:
            raise ConfigError(f"batch must be between 1 and 10000, got {batch!r}")
        if not claim_s > 0 or not op_timeout_s > 0 or not dedup_s >= claim_s:
            raise ConfigError("claim_s and op_timeout_s must be > 0 and dedup_s >= claim_s")
        self.queues = None if queues is None else sorted(set(queues))
        self.batch, self.claim_s, self.dedup_s = batch, claim_s, dedup_s
        self.poll_s = poll_s if poll_s is not None else (1.0 if self._pg else 0.1)
        self.op_timeout_s = op_timeout_s
        self.sent = 0  # rows accepted by an owner and deleted, since start
        self.failures = 0  # rounds that ended in an error, since start
        self._engine: Any = None
        self._task: asyncio.Task[None] | None = None
        self._listener: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._token = ""  # this round's claim token (a fresh secret per round)
        #: Test hook: awaited after the owner accepted a round's rows, before they are deleted.
        self.after_send: Callable[[list[str]], Awaitable[None]] | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self, app: Any = None) -> None:
        """Create the table if missing and start relaying (raises StorageUnavailable if the
        database cannot be reached)."""
        from sqlalchemy.ext.asyncio import create_async_engine

        # No pre-ping (a round trip per statement): a connection that died fails its round,
        # SQLAlchemy discards it, and the retry gets a fresh one.
        kwargs: dict[str, Any] = {}
        if self._pg:
            ms = str(round(self.op_timeout_s * 1000))
            kwargs["connect_args"] = {"timeout": self.op_timeout_s,
                                      "command_timeout": self.op_timeout_s,
                                      "server_settings": {"lock_timeout": ms,
                                                          "statement_timeout": ms}}
        else:
            kwargs["connect_args"] = {"timeout": self.op_timeout_s}
        self._engine = create_async_engine(self.url, **kwargs)
        await self._db("create", self._create)
        self._task = asyncio.create_task(self._run(), name=f"outbox-relay:{self.table.name}")
        if self._pg:
            self._listener = asyncio.create_task(self._listen())

    async def stop(self, app: Any = None) -> None:
        """Stop after the current round (rows it claimed but did not send are released when
        their claim lapses) and close the pool."""
        for task in (self._task, self._listener):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = self._listener = None
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None

    # -- the database, one statement per call ---------------------------------------------------
    async def _db(self, op: str, fn: Callable[[Any], Awaitable[T]]) -> T:
        """``fn(conn)`` in one short transaction under ``op_timeout_s``; StorageUnavailable."""
        from sqlalchemy.exc import SQLAlchemyError

        async def run() -> T:
            if self._pg:  # one statement: atomic alone, no BEGIN/COMMIT round trips
                async with self._engine.connect() as conn:
                    auto = await conn.execution_options(isolation_level="AUTOCOMMIT")
                    return await fn(auto)
            async with self._engine.begin() as conn:
                return await fn(conn)

        try:
            return await asyncio.wait_for(run(), self.op_timeout_s)
        except (asyncio.TimeoutError, OSError, SQLAlchemyError) as exc:
            raise StorageUnavailable(f"outbox {self.table.name!r}: {op} failed: "
                                     f"{type(exc).__name__}: {exc}") from exc

    async def _create(self, conn: Any) -> None:
        from sqlalchemy.exc import DBAPIError

        try:  # relays racing to create it: the loser finds it on the next start
            await conn.run_sync(self.table.create, checkfirst=True)
        except DBAPIError as exc:
            if "exist" not in str(exc):
                raise

    async def _claim(self, conn: Any) -> list[Any]:
        from sqlalchemy import or_, select, update

        t = self.table
        now = self.app.node.clock.now()
        pick = select(t.c.id).where(or_(t.c.claimed_until.is_(None), t.c.claimed_until <= now))
        if self.queues is not None:
            pick = pick.where(t.c.queue.in_(self.queues))
        pick = pick.order_by(t.c.id).limit(self.batch)
        if self._pg:
            pick = pick.with_for_update(skip_locked=True)
        stmt = (update(t).where(t.c.id.in_(pick))
                .values(claim_token=self._token, claimed_until=now + self.claim_s)
                .returning(*(t.c[c] for c in _COLUMNS)))
        rows = (await conn.execute(stmt)).all()
        return sorted(rows, key=lambda r: r.id)

    async def _finish(self, ids: list[int], *, delete: bool) -> None:
        """Delete (accepted) or release (not sent) this round's rows ``ids``."""
        from sqlalchemy import delete as sql_delete
        from sqlalchemy import update

        t = self.table
        where = (t.c.id.in_(ids), t.c.claim_token == self._token)
        stmt = sql_delete(t).where(*where) if delete else \
            update(t).where(*where).values(claim_token=None, claimed_until=None)
        await self._db("delete" if delete else "release", lambda conn: conn.execute(stmt))

    # -- the loop -------------------------------------------------------------------------------
    async def _run(self) -> None:
        backoff = 0.0
        while True:
            self._wake.clear()  # a commit from here on wakes the next wait
            try:
                claimed = await self.round()
                backoff = 0.0
            except (IstosError, OSError) as exc:
                self.failures += 1
                backoff = min(max(2 * backoff, 0.05), 2.0)
                log.warning("outbox relay %r: %s (retrying in %.2fs)", self.table.name, exc,
                            backoff)
                await asyncio.sleep(backoff)  # not cut short by NOTIFY: the fault is elsewhere
                continue
            if claimed < self.batch:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_s)

    async def round(self) -> int:
        """One claim-send-delete round; returns how many rows it claimed. Raises
        StorageUnavailable (the database) or the owner's error (rows released)."""
        self._token = self.app.node.ids.token()
        rows = await self._db("claim", self._claim)
        if not rows:
            return 0
        by_queue: dict[str, list[Any]] = {}
        for row in rows:
            by_queue.setdefault(row.queue, []).append(row)
        results = await asyncio.gather(*(self._send(q, rs) for q, rs in by_queue.items()))
        done = [i for ids, _ in results for i in ids]
        accepted = set(done)
        if done:
            if self.after_send is not None:
                await self.after_send([r.job_id for r in rows if r.id in accepted])
            await self._finish(done, delete=True)
            self.sent += len(done)
        failed = [r.id for r in rows if r.id not in accepted]
        errors = [e for _, e in results if e is not None]
        if failed:
            await self._finish(failed, delete=False)
        if errors:
            raise errors[0]
        return len(rows)

    async def _send(self, queue: str, rows: list[Any]) -> tuple[list[int], Exception | None]:
        """Send ``rows`` (one queue's, in id order); the ids accepted, and the error that
        stopped the rest (later rows are not sent past a failure, to keep their order)."""
        client = self.app.client(queue)
        items = [self._item(r) for r in rows]
        done: list[int] = []
        for start, end in batches.cut([batches.item_size(i) for i in items]):
            try:
                try:
                    await client.call("enqueue_many", items=items[start:end])
                except (InvalidJob, ProtocolError):
                    await self._one_by_one(client, queue, items[start:end])
            except IstosError as exc:
                return done, exc
            done.extend(r.id for r in rows[start:end])
        return done, None

    async def _one_by_one(self, client: Any, queue: str, items: list[dict[str, Any]]) -> None:
        """A batch refused whole (nothing stored): each alone, so one bad row cannot hold up
        the others; a row the owner refuses by itself is logged and left (claimed) in place."""
        for item in items:
            try:
                await client.call("enqueue", **item)
            except (InvalidJob, ProtocolError) as exc:
                log.error("outbox %r: queue %r refuses job %s: %s; the row stays in the table",
                          self.table.name, queue, item["job_id"], exc)
                raise

    def _item(self, row: Any) -> dict[str, Any]:
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

    # -- waking on commits (PostgreSQL) -----------------------------------------------------------
    async def _listen(self) -> None:
        """Hold a LISTEN connection (asyncpg) and wake the loop on every notification;
        reconnect after a failure (the poll covers the gap)."""
        import asyncpg
        from sqlalchemy.engine import make_url

        dsn = make_url(self.url).set(drivername="postgresql").render_as_string(
            hide_password=False)
        while True:
            conn = None
            try:
                conn = await asyncpg.connect(dsn, timeout=self.op_timeout_s)
                closed = asyncio.Event()
                conn.add_termination_listener(lambda _c, ev=closed: ev.set())
                await conn.add_listener(channel(self.table.name),
                                        lambda *_args: self._wake.set())
                self._wake.set()  # rows committed while we were not listening
                await closed.wait()
            except (OSError, asyncio.TimeoutError, asyncpg.PostgresError) as exc:
                log.warning("outbox relay %r: LISTEN failed: %s", self.table.name, exc)
            finally:
                if conn is not None and not conn.is_closed():
                    conn.terminate()
            await asyncio.sleep(self.poll_s)

    # -- observability --------------------------------------------------------------------------
    async def stats(self) -> dict[str, Any]:
        """``depth`` (rows waiting, claimed ones included), ``claimed``, ``oldest_age_s``
        (None when empty), and this relay's ``sent`` and ``failures`` counts."""
        from sqlalchemy import func, select

        t = self.table

        async def read(conn: Any) -> Any:
            return (await conn.execute(select(func.count(), func.count(t.c.claim_token),
                                              func.min(t.c.created_at)))).one()

        depth, claimed, oldest = await self._db("stats", read)
        age = None if oldest is None else max(0.0, self.app.node.clock.now() - oldest)
        return {"depth": int(depth), "claimed": int(claimed), "oldest_age_s": age,
                "sent": self.sent, "failures": self.failures}
