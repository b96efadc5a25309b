"""The relay's SQL adapter: an outbox table on PostgreSQL (asyncpg) or SQLite (aiosqlite).

Every call is one statement in its own transaction (autocommit on PostgreSQL), so a relay
never holds a row lock across a wait on the network: the claim is one ``UPDATE .. WHERE id IN
(SELECT .. ORDER BY id LIMIT n FOR UPDATE SKIP LOCKED) RETURNING ..`` that commits at once.
On PostgreSQL :meth:`SQLOutboxStore.listen` holds its own asyncpg connection on the table's
channel (the writers' ``pg_notify`` is delivered when their transaction commits).

On PostgreSQL the relay's own statements (claim, delete or release, stats) go straight to an
asyncpg pool, as SQL text asyncpg prepares once per connection: a claim is then one round
trip, where the same statement through SQLAlchemy's async layer cost several times as much
(it sits between a commit and its job's pickup). SQLAlchemy still creates the table, serves
SQLite, and builds the delete step the queue's own SQL storage runs in its transaction.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..cancel_guard import within
from ..errors import ConfigError, StorageUnavailable
from .store import OutboxRow
from .table import channel, outbox_table

log = logging.getLogger("istos.outbox")
T = TypeVar("T")
_COLUMNS = ("id", "queue", "job_id", "body", "delay_s", "priority", "dedup_s", "job_group",
            "created_at")


class SQLOutboxStore:
    """Outbox table ``table`` at SQLAlchemy async URL ``url``; each call bounded by
    ``op_timeout_s`` and failing with :class:`StorageUnavailable`. Raises
    :class:`ConfigError` for a URL of another dialect."""

    def __init__(self, url: str, table: str, *, op_timeout_s: float = 5.0) -> None:
        from sqlalchemy.engine import make_url

        self.url = url
        self.table = outbox_table(table)
        backend = make_url(url).get_backend_name()
        if backend not in ("postgresql", "sqlite"):
            raise ConfigError(f"the outbox relay supports postgresql and sqlite, not {backend!r}")
        self.pg = backend == "postgresql"
        self.default_poll_s = 1.0 if self.pg else 0.1
        self.op_timeout_s = op_timeout_s
        self._engine: Any = None
        self._pool: Any = None  # asyncpg's, PostgreSQL only
        name = f'"{self.table.name}"'  # checked by outbox_table: letters, digits and '_'
        cols = ", ".join(_COLUMNS)
        due = "(claimed_until IS NULL OR claimed_until <= $3)"
        pick = f"SELECT id FROM {name} WHERE {due}{{queues}} ORDER BY id LIMIT $4 " \
               "FOR UPDATE SKIP LOCKED"
        claim = f"UPDATE {name} SET claim_token = $1, claimed_until = $2 WHERE id IN " \
                f"({pick}) RETURNING {cols}"
        self._sql = {
            "claim": claim.format(queues=""),
            "claim_queues": claim.format(queues=" AND queue = ANY($5::text[])"),
            "delete": f"DELETE FROM {name} WHERE id = ANY($1::bigint[]) AND claim_token = $2",
            "release": f"UPDATE {name} SET claim_token = NULL, claimed_until = NULL "
                       "WHERE id = ANY($1::bigint[]) AND claim_token = $2",
            "stats": f"SELECT count(*), count(claim_token), min(created_at) FROM {name}",
        }

    async def open(self) -> None:
        """Connect and create the table if missing."""
        from sqlalchemy.ext.asyncio import create_async_engine

        # No pre-ping (a round trip per statement): a connection that died fails its round,
        # SQLAlchemy discards it, and the retry gets a fresh one.
        kwargs: dict[str, Any] = {}
        if self.pg:
            ms = str(round(self.op_timeout_s * 1000))
            kwargs["connect_args"] = {"timeout": self.op_timeout_s,
                                      "command_timeout": self.op_timeout_s,
                                      "server_settings": {"lock_timeout": ms,
                                                          "statement_timeout": ms}}
        else:
            kwargs["connect_args"] = {"timeout": self.op_timeout_s}
        self._engine = create_async_engine(self.url, **kwargs)
        await self._db("create", self._create)
        if self.pg:
            import asyncpg

            ms = str(round(self.op_timeout_s * 1000))
            try:
                self._pool = await within(asyncpg.create_pool(
                    self._dsn(), min_size=1, max_size=4, timeout=self.op_timeout_s,
                    command_timeout=self.op_timeout_s,
                    server_settings={"lock_timeout": ms, "statement_timeout": ms}),
                    self.op_timeout_s)
            except (asyncio.TimeoutError, OSError, asyncpg.PostgresError,
                    asyncpg.InterfaceError) as exc:
                raise StorageUnavailable(f"outbox {self.table.name!r}: connect failed: "
                                         f"{type(exc).__name__}: {exc}") from exc

    async def close(self) -> None:
        engine, self._engine = self._engine, None
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.terminate()
        if engine is not None:
            await engine.dispose()

    def _dsn(self) -> str:
        """The URL as libpq/asyncpg spells it (SQLAlchemy's driver name dropped)."""
        from sqlalchemy.engine import make_url

        return make_url(self.url).set(drivername="postgresql").render_as_string(
            hide_password=False)

    async def _raw(self, op: str, method: str, sql: str, *args: Any) -> Any:
        """One autocommitted statement on the asyncpg pool under ``op_timeout_s``;
        StorageUnavailable on any failure (a broken connection is replaced by the pool)."""
        import asyncpg

        pool = self._pool
        if pool is None:
            raise StorageUnavailable(f"outbox {self.table.name!r}: {op}: not open")
        try:
            return await within(getattr(pool, method)(sql, *args), self.op_timeout_s)
        except (asyncio.TimeoutError, OSError, asyncpg.PostgresError,
                asyncpg.InterfaceError) as exc:
            raise StorageUnavailable(f"outbox {self.table.name!r}: {op} failed: "
                                     f"{type(exc).__name__}: {exc}") from exc

    async def _db(self, op: str, fn: Callable[[Any], Awaitable[T]]) -> T:
        """``fn(conn)`` in one short transaction under ``op_timeout_s``; StorageUnavailable."""
        from sqlalchemy.exc import SQLAlchemyError

        async def run() -> T:
            if self.pg:  # one statement: atomic alone, no BEGIN/COMMIT round trips
                async with self._engine.connect() as conn:
                    auto = await conn.execution_options(isolation_level="AUTOCOMMIT")
                    return await fn(auto)
            async with self._engine.begin() as conn:
                return await fn(conn)

        try:
            return await within(run(), self.op_timeout_s)
        except (asyncio.TimeoutError, OSError, SQLAlchemyError) as exc:
            raise StorageUnavailable(f"outbox {self.table.name!r}: {op} failed: "
                                     f"{type(exc).__name__}: {exc}") from exc

    async def _create(self, conn: Any) -> None:
        from sqlalchemy.exc import DBAPIError

        try:  # relays racing to create it: the loser finds it there
            await conn.run_sync(self.table.create, checkfirst=True)
        except DBAPIError as exc:
            if "exist" not in str(exc):
                raise

    async def claim(self, token: str, now: float, claim_s: float, limit: int,
                    queues: list[str] | None) -> list[OutboxRow]:
        from sqlalchemy import or_, select, update

        if self.pg:
            if queues is None:
                found = await self._raw("claim", "fetch", self._sql["claim"], token,
                                        now + claim_s, now, limit)
            else:
                found = await self._raw("claim", "fetch", self._sql["claim_queues"], token,
                                        now + claim_s, now, limit, list(queues))
            return sorted((OutboxRow(**{**dict(r), "body": bytes(r["body"])}) for r in found),
                          key=lambda r: r.id)
        t = self.table
        pick = select(t.c.id).where(or_(t.c.claimed_until.is_(None), t.c.claimed_until <= now))
        if queues is not None:
            pick = pick.where(t.c.queue.in_(queues))
        pick = pick.order_by(t.c.id).limit(limit)
        if self.pg:
            pick = pick.with_for_update(skip_locked=True)
        stmt = (update(t).where(t.c.id.in_(pick))
                .values(claim_token=token, claimed_until=now + claim_s)
                .returning(*(t.c[c] for c in _COLUMNS)))

        async def run(conn: Any) -> list[Any]:
            return list((await conn.execute(stmt)).all())

        rows = await self._db("claim", run)
        return sorted((OutboxRow(**{**r._asdict(), "body": bytes(r.body)}) for r in rows),
                      key=lambda r: r.id)

    def same_database(self, url: str) -> bool:
        """Whether SQLAlchemy URL ``url`` names this outbox's PostgreSQL database (same host,
        port, database and user; driver and password aside). SQLite is never "the same": its
        one writer at a time would make the owner's write wait on the relay's own connection."""
        from sqlalchemy.engine import make_url

        a, b = make_url(self.url), make_url(url)
        if a.get_backend_name() != "postgresql" or b.get_backend_name() != "postgresql":
            return False
        return (a.host or "localhost", a.port or 5432, a.database, a.username) == \
            (b.host or "localhost", b.port or 5432, b.database, b.username)

    def delete_step(self, ids: list[int], token: str) -> Any:
        """A :data:`~istos.storage.base.TxStep` deleting rows ``ids`` still claimed by
        ``token``, for the queue's own SQL storage to run in its write's transaction."""
        from sqlalchemy import delete as sql_delete

        stmt = sql_delete(self.table).where(self.table.c.id.in_(ids),
                                            self.table.c.claim_token == token)

        async def step(conn: Any) -> None:
            await conn.execute(stmt)

        return step

    async def finish(self, ids: list[int], token: str, *, delete: bool) -> None:
        from sqlalchemy import delete as sql_delete
        from sqlalchemy import update

        if self.pg:
            op = "delete" if delete else "release"
            await self._raw(op, "execute", self._sql[op], list(ids), token)
            return
        t = self.table
        where = (t.c.id.in_(ids), t.c.claim_token == token)
        stmt = sql_delete(t).where(*where) if delete else \
            update(t).where(*where).values(claim_token=None, claimed_until=None)
        await self._db("delete" if delete else "release", lambda conn: conn.execute(stmt))

    async def stats(self, now: float) -> dict[str, Any]:
        from sqlalchemy import func, select

        if self.pg:
            depth, claimed, oldest = await self._raw("stats", "fetchrow", self._sql["stats"])
            return {"depth": int(depth), "claimed": int(claimed),
                    "oldest_age_s": None if oldest is None else max(0.0, now - oldest)}
        t = self.table

        async def read(conn: Any) -> Any:
            return (await conn.execute(select(func.count(), func.count(t.c.claim_token),
                                              func.min(t.c.created_at)))).one()

        depth, claimed, oldest = await self._db("stats", read)
        return {"depth": int(depth), "claimed": int(claimed),
                "oldest_age_s": None if oldest is None else max(0.0, now - oldest)}

    async def listen(self, wake: Callable[[], None]) -> None:
        """PostgreSQL: hold a LISTEN connection (asyncpg) and ``wake`` on every notification;
        reconnect after a failure (the relay's poll covers the gap). SQLite: return."""
        if not self.pg:
            return
        import asyncpg

        dsn = self._dsn()
        while True:
            conn = None
            try:
                conn = await asyncpg.connect(dsn, timeout=self.op_timeout_s)
                closed = asyncio.Event()
                conn.add_termination_listener(lambda _c, ev=closed: ev.set())
                await conn.add_listener(channel(self.table.name), lambda *_args: wake())
                wake()  # rows committed while nobody listened
                await closed.wait()
            except (OSError, asyncio.TimeoutError, asyncpg.PostgresError) as exc:
                log.warning("outbox %r: LISTEN failed: %s", self.table.name, exc)
            finally:
                if conn is not None and not conn.is_closed():
                    conn.terminate()
            # The adapter's own reconnect pause (live PostgreSQL only, never simulated).
            await asyncio.sleep(1.0)
