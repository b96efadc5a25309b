"""SQL storage on SQLAlchemy 2 asyncio: PostgreSQL (asyncpg) or SQLite (aiosqlite).

Schema (one table, default name ``istos_kv``; created by :meth:`SQLAlchemyStoragePlugin.open`
with ``CREATE TABLE IF NOT EXISTS``)::

    ns          VARCHAR(255)      NOT NULL   -- namespace, e.g. "jobs:emails"
    key         VARCHAR(255)      NOT NULL   -- key within the namespace
    value       BYTEA / BLOB      NOT NULL   -- opaque bytes
    expires_at  DOUBLE PRECISION  NULL       -- caller-clock epoch seconds; NULL = never expires
    PRIMARY KEY (ns, key)

``expires_at`` is only set by ``put_if_absent`` and leader leases; a plain ``put`` resets it to
NULL. Leader leases are rows of namespace ``#leader`` (key: the lease name, value:
``b"{epoch}\n{holder}"``, ``expires_at``: when it runs out). Acquiring is a read followed by a
compare-and-set ``UPDATE .. WHERE value = :seen AND expires_at = :seen`` (or an ``INSERT .. ON
CONFLICT DO NOTHING`` for the first leader), so of N racers one wins. A fenced ``apply`` starts
its transaction with a no-op ``UPDATE`` of the lease row conditional on the fence's value: zero
rows means another epoch began (nothing is written); otherwise the row stays locked until the
write commits, so an acquire cannot fall between the check and the write. Expiry is
judged by the ``now`` the caller passes in, never by the database clock, so the simulator's and
skewed replicas' clocks apply. Like the in-memory adapter, an expired row stays readable by
``get``/``scan`` until replaced or deleted.

Writes are upserts (``INSERT .. ON CONFLICT (ns, key) DO UPDATE``), so each call is one statement
in one transaction. ``put_if_absent`` is the same statement with ``WHERE expires_at IS NOT NULL
AND expires_at <= :now`` on the update branch and ``RETURNING``: a returned row means this call
wrote. The database serialises racing inserts on the primary key, so exactly one of N racers wins;
on PostgreSQL it runs in autocommit, so the racers wait for the winner's statement, never for its
client's COMMIT. The other one-statement calls (``get``, ``scan``, ``put``, ``delete``) run in
autocommit there too: no transaction stays open while the client reads rows or sends COMMIT.

No session can hold leadership hostage (PostgreSQL): the lease statements (acquire, renew,
release, read) run in autocommit, one statement each, so a leader frozen or cut off between two
round trips holds no row lock; every session is opened with ``lock_timeout`` and
``idle_in_transaction_session_timeout`` of ``hold_timeout_s`` (a multi-statement write, such as
a large ``put_many``, whose client stopped is rolled back by the server and its locks freed),
``statement_timeout`` of ``op_timeout_s``, and server-side TCP keepalives plus
``tcp_user_timeout`` that notice a vanished client within about ``hold_timeout_s + 3`` s. Keep
``hold_timeout_s`` well under the queue's ``ha_lease_s``. The client side bounds every call by
``op_timeout_s``.

Failures to reach the database, timeouts and refused writes raise
:class:`~istos.errors.StorageUnavailable` naming the URL (password hidden) and the operation.
``pool_pre_ping`` discards dead pooled connections, so the first call after the database is
back succeeds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from istos.cancel_guard import within
from istos.errors import ConfigError, FencedOut, StorageUnavailable

from .base import LEADER_NS, Fence, LeaderLease, TxStep

T = TypeVar("T")

# Rows per multi-row INSERT: 4 bound parameters each keeps a statement far below the
# parameter limits of asyncpg (32767) and SQLite (32766).
_CHUNK_ROWS = 1000


class SQLAlchemyStoragePlugin:
    """Durable storage in one SQL table; see the module docstring for the schema.

    ``url`` is an SQLAlchemy async URL: ``postgresql+asyncpg://user@host:5432/db``,
    ``sqlite+aiosqlite:///path/file.db`` or ``sqlite+aiosqlite:///:memory:``. In-memory SQLite
    lives and dies with this object, so it reports ``durable=False`` and ``shared=False``.
    ``op_timeout_s`` bounds each call, connecting included. ``hold_timeout_s`` (PostgreSQL)
    bounds how long a statement waits for a row lock and how long a session may sit idle inside
    an open transaction before the server ends it (see the module docstring).

    Raises :class:`~istos.errors.ConfigError` at construction if SQLAlchemy is not installed, or
    the URL is malformed or names a dialect other than PostgreSQL or SQLite, or for a bad
    timeout. Every call raises :class:`~istos.errors.StorageUnavailable` (nothing written)
    when the database cannot be reached in time or refuses, and an HA leader's write
    :class:`~istos.errors.FencedOut` once another replica holds the epoch.
    """

    def __init__(self, url: str, *, table: str = "istos_kv", op_timeout_s: float = 5.0,
                 hold_timeout_s: float = 1.0) -> None:
        # Imported here, not at module top, so `import istos` never needs SQLAlchemy installed.
        try:
            from sqlalchemy import Column, Double, LargeBinary, MetaData, String, Table
            from sqlalchemy.engine import make_url
            from sqlalchemy.exc import ArgumentError
        except ImportError as exc:
            raise ConfigError(
                "SQLAlchemyStoragePlugin needs SQLAlchemy: pip install istos-nb[sqlalchemy]"
            ) from exc
        if not op_timeout_s > 0:
            raise ConfigError("SQLAlchemyStoragePlugin op_timeout_s must be > 0 seconds")
        if not 0.001 <= hold_timeout_s < 3600:
            raise ConfigError("SQLAlchemyStoragePlugin hold_timeout_s must be between 0.001 and "
                              f"3600 seconds (well under ha_lease_s), not {hold_timeout_s!r}")
        try:
            parsed = make_url(url)
        except ArgumentError as exc:
            raise ConfigError(f"SQLAlchemyStoragePlugin: malformed database URL: {exc}") from exc
        backend = parsed.get_backend_name()
        if backend not in ("postgresql", "sqlite"):
            raise ConfigError(
                f"SQLAlchemyStoragePlugin supports postgresql and sqlite URLs, not {backend!r}"
            )
        self.url = url
        self.table_name = table
        self.op_timeout_s = op_timeout_s
        self.hold_timeout_s = hold_timeout_s
        self._backend = backend
        # Lease statements run in autocommit there: no transaction left open between round trips.
        self._pg = backend == "postgresql"
        self._safe_url = parsed.render_as_string(hide_password=True)
        self._memory = backend == "sqlite" and (
            parsed.database in (None, "", ":memory:") or parsed.query.get("mode") == "memory"
        )
        self.durable = not self._memory
        self.shared = not self._memory
        # StaticPool hands one connection to every caller and rolls it back when each returns
        # it, which would undo a concurrent caller's uncommitted write: serialise instead.
        self._serial = asyncio.Lock() if self._memory else None
        self._engine: Any = None
        self._created = False
        self._create_lock = asyncio.Lock()
        self._table: Any = Table(
            table,
            MetaData(),
            Column("ns", String(255), primary_key=True),
            Column("key", String(255), primary_key=True),
            Column("value", LargeBinary, nullable=False),
            Column("expires_at", Double, nullable=True),
        )

    @property
    def request_timeout_s(self) -> float:
        """How long a call may take (``op_timeout_s``): the owner's read fence waits no
        longer than this for a write (``owner/persistence/write_path.py``)."""
        return self.op_timeout_s

    # -- plumbing -----------------------------------------------------------------------------

    def _ensure_engine(self) -> Any:
        if self._engine is not None:
            return self._engine
        from sqlalchemy.ext.asyncio import create_async_engine

        kwargs: dict[str, Any] = {"pool_pre_ping": True}
        if self._backend == "postgresql":
            # asyncpg: `timeout` bounds connecting, `command_timeout` each statement.
            kwargs["connect_args"] = {
                "timeout": self.op_timeout_s,
                "command_timeout": self.op_timeout_s,
                "server_settings": self._pg_session_settings(),
            }
            kwargs["pool_timeout"] = self.op_timeout_s
        elif self._memory:
            from sqlalchemy.pool import StaticPool

            # Every new :memory: connection is a new, empty database: keep exactly one.
            kwargs["poolclass"] = StaticPool
            kwargs["connect_args"] = {"check_same_thread": False}
        else:
            # sqlite3's `timeout` is how long a writer waits for the file lock held by another.
            kwargs["connect_args"] = {"timeout": self.op_timeout_s}
            kwargs["pool_timeout"] = self.op_timeout_s
        self._engine = create_async_engine(self.url, **kwargs)
        return self._engine

    def _pg_session_settings(self) -> dict[str, str]:
        """Per-session PostgreSQL settings so that no stuck client holds locks for long."""
        hold_ms = max(1, round(self.hold_timeout_s * 1000))
        idle_s = max(1, round(self.hold_timeout_s))  # keepalive settings are whole seconds
        return {
            "lock_timeout": str(hold_ms),
            "idle_in_transaction_session_timeout": str(hold_ms),
            "statement_timeout": str(max(1, round(self.op_timeout_s * 1000))),
            "tcp_keepalives_idle": str(idle_s),
            "tcp_keepalives_interval": "1",
            "tcp_keepalives_count": "3",
            "tcp_user_timeout": str((idle_s + 3) * 1000),
        }

    def _insert(self) -> Any:
        """The dialect's INSERT construct, which offers ``on_conflict_do_update``."""
        if self._backend == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert
            return pg_insert(self._table)
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert
        return sqlite_insert(self._table)

    async def _call(self, op: str, fn: Callable[[Any], Awaitable[T]], *,
                    autocommit: bool = False) -> T:
        """Run ``fn(connection)`` in one transaction under the deadline, translating failures."""
        from sqlalchemy.exc import DBAPIError, DisconnectionError
        from sqlalchemy.exc import TimeoutError as PoolTimeout

        engine = self._ensure_engine()

        async def run() -> T:
            if not self._created:
                await self._create_table(engine)
            if autocommit:  # one statement: atomic by itself, no BEGIN/COMMIT round trips
                async with engine.connect() as conn:
                    auto = await conn.execution_options(isolation_level="AUTOCOMMIT")
                    return await fn(auto)
            async with engine.begin() as conn:
                return await fn(conn)

        async def guarded() -> T:
            if self._serial is None:
                return await run()
            async with self._serial:
                return await run()

        try:
            return await within(guarded(), self.op_timeout_s)
        except (asyncio.TimeoutError, PoolTimeout) as exc:
            raise StorageUnavailable(
                f"database at {self._safe_url} did not answer {op} within {self.op_timeout_s}s"
            ) from exc
        except (OSError, DBAPIError, DisconnectionError) as exc:
            # DBAPIError covers both lost connections (OperationalError, InterfaceError,
            # connection_invalidated) and refused writes (e.g. a key longer than 255 on
            # PostgreSQL): either way nothing was accepted and the caller must refuse.
            raise StorageUnavailable(
                f"database at {self._safe_url} failed during {op}: {type(exc).__name__}: {exc}"
            ) from exc

    async def _create_table(self, engine: Any) -> None:
        """Create the table unless it exists, tolerating other replicas doing the same.

        ``create_all(checkfirst=True)`` is check-then-CREATE, not atomic, and even PostgreSQL's
        ``CREATE TABLE IF NOT EXISTS`` is not: a replica that loses the race gets "already
        exists" (or a pg_type unique violation). Once it has lost, the winner has committed, so
        trying again finds the table. On PostgreSQL the creation is that one statement in
        autocommit: a check-then-CREATE transaction sits idle between its statements, and a
        loaded client overstays ``idle_in_transaction_session_timeout`` (``hold_timeout_s``).
        """
        from sqlalchemy.exc import DBAPIError
        from sqlalchemy.schema import CreateTable

        async with self._create_lock:  # replicas race across processes; we need not race ourselves
            if self._created:
                return
            for attempt in range(3):
                try:
                    if self._pg:
                        async with engine.connect() as conn:
                            auto = await conn.execution_options(isolation_level="AUTOCOMMIT")
                            await auto.execute(CreateTable(self._table, if_not_exists=True))
                    else:
                        async with engine.begin() as conn:
                            await conn.run_sync(self._table.metadata.create_all, checkfirst=True)
                    break
                except DBAPIError as exc:
                    if attempt == 2 or exc.connection_invalidated:
                        raise
            self._created = True

    # -- Storage protocol ---------------------------------------------------------------------

    async def open(self) -> None:
        """Connect and create the table if missing; raises StorageUnavailable if unreachable."""
        from sqlalchemy import select

        await self._call("open", lambda conn: conn.execute(select(1)))

    async def close(self) -> None:
        """Dispose of the pool. An in-memory SQLite database is gone after this."""
        engine, self._engine = self._engine, None
        self._created = False
        if engine is not None:
            await engine.dispose()

    def _upsert(self, rows: list[dict[str, Any]]) -> Any:
        stmt = self._insert().values(rows)
        return stmt.on_conflict_do_update(
            index_elements=["ns", "key"],
            set_={"value": stmt.excluded.value, "expires_at": None},
        )

    async def put(self, ns: str, key: str, value: bytes) -> None:
        """Upsert ``value``; clears any expiry set by ``put_if_absent``."""
        row = {"ns": ns, "key": key, "value": value, "expires_at": None}
        await self._call("put", lambda conn: conn.execute(self._upsert([row])),
                         autocommit=self._pg)

    async def put_many(self, ns: str, items: list[tuple[str, bytes]]) -> None:
        """Upsert all items in one transaction, as multi-row statements of up to 1000 rows.

        Later duplicates of a key win (PostgreSQL rejects a statement that would upsert the same
        row twice, so duplicates are folded first).
        """
        if not items:
            return
        rows = [
            {"ns": ns, "key": key, "value": value, "expires_at": None}
            for key, value in dict(items).items()
        ]

        async def run(conn: Any) -> None:
            for start in range(0, len(rows), _CHUNK_ROWS):
                await conn.execute(self._upsert(rows[start : start + _CHUNK_ROWS]))

        await self._call("put_many", run)

    async def apply(self, ns: str, puts: list[tuple[str, bytes]], deletes: list[str], *,
                    fence: Fence | None = None, also: Sequence[TxStep] = ()) -> None:
        """Upsert ``puts`` and delete ``deletes`` in one transaction (one round trip each);
        with ``fence``, the transaction first checks and locks the lease row (FencedOut).
        ``also``: statements of the caller's that commit or fail with this write, run after
        it in the same transaction (:data:`~istos.storage.base.TxStep`). Raises
        StorageUnavailable when the database fails or refuses any of it (nothing is kept)."""
        from sqlalchemy import delete

        t = self._table
        rows = [{"ns": ns, "key": key, "value": value, "expires_at": None}
                for key, value in dict(puts).items()]
        gone = list(dict.fromkeys(deletes))
        if self._backend == "postgresql" and (rows or gone) and not also:
            await self._pg_apply(ns, rows, gone, fence)
            return

        async def run(conn: Any) -> None:
            if fence is not None:
                await self._check_fence(conn, fence)
            for start in range(0, len(rows), _CHUNK_ROWS):
                await conn.execute(self._upsert(rows[start : start + _CHUNK_ROWS]))
            for start in range(0, len(gone), _CHUNK_ROWS):
                chunk = gone[start : start + _CHUNK_ROWS]
                await conn.execute(delete(t).where(t.c.ns == ns, t.c.key.in_(chunk)))
            for step in also:
                await step(conn)

        if rows or gone or also:
            await self._call("apply", run)

    async def _pg_apply(self, ns: str, rows: list[dict[str, Any]], gone: list[str],
                        fence: Fence | None) -> None:
        """PostgreSQL: the whole apply as ONE statement in autocommit (one round trip, atomic
        as a statement is; the SQL text is fixed, so asyncpg reuses its prepared statement):
        upsert from arrays (``unnest``), delete by ``= ANY``, and with ``fence`` a first
        sub-statement that checks and locks the lease row, which the writes depend on (they
        read its RETURNING), so a moved-on epoch writes nothing (FencedOut)."""
        from sqlalchemy import text

        doomed = set(gone)  # delete wins over a put of the same key, as in the generic path
        keys = [r["key"] for r in rows if r["key"] not in doomed]
        values = [r["value"] for r in rows if r["key"] not in doomed]
        params: dict[str, Any] = {"ns": ns, "keys": keys, "vals": values, "gone": gone}
        if fence is not None:
            params.update(lns=LEADER_NS, lname=fence.name,
                          lval=_lease_value(fence.epoch, fence.holder))
        stmt = text(self._pg_apply_sql(fence is not None))

        async def run(conn: Any) -> Any:
            return (await conn.execute(stmt, params)).scalar()

        checked = await self._call("apply", run, autocommit=True)
        if fence is not None and checked != 1:
            raise FencedOut(f"database at {self._safe_url}: leader lease {fence.name!r} is no "
                            f"longer at epoch {fence.epoch}; nothing was written")

    def _pg_apply_sql(self, fenced: bool) -> str:
        t = self._ensure_engine().dialect.identifier_preparer.quote(self._table.name)
        gate = " AND EXISTS (SELECT 1 FROM f)" if fenced else ""
        fence = (f"f AS (UPDATE {t} SET expires_at = expires_at WHERE ns = :lns AND key = "
                 ":lname AND value = :lval RETURNING 1), ") if fenced else ""
        return (
            f"WITH {fence}ins AS (INSERT INTO {t} (ns, key, value, expires_at) "
            "SELECT :ns, u.k, u.v, NULL FROM unnest(CAST(:keys AS varchar[]), "
            f"CAST(:vals AS bytea[])) AS u(k, v) WHERE true{gate} "
            "ON CONFLICT (ns, key) DO UPDATE SET value = EXCLUDED.value, expires_at = NULL "
            f"RETURNING 1), del AS (DELETE FROM {t} WHERE ns = :ns AND "
            f"key = ANY(CAST(:gone AS varchar[])){gate} RETURNING 1) "
            + ("SELECT count(*) FROM f" if fenced else
               "SELECT (SELECT count(*) FROM ins) + (SELECT count(*) FROM del)"))

    async def get(self, ns: str, key: str) -> bytes | None:
        from sqlalchemy import select

        t = self._table

        async def run(conn: Any) -> bytes | None:
            result = await conn.execute(select(t.c.value).where(t.c.ns == ns, t.c.key == key))
            value = result.scalar_one_or_none()
            return None if value is None else bytes(value)

        return await self._call("get", run, autocommit=self._pg)

    async def delete(self, ns: str, key: str) -> None:
        from sqlalchemy import delete

        t = self._table
        await self._call(
            "delete", lambda conn: conn.execute(delete(t).where(t.c.ns == ns, t.c.key == key)),
            autocommit=self._pg)

    async def scan(self, ns: str) -> list[tuple[str, bytes]]:
        from sqlalchemy import select

        t = self._table

        async def run(conn: Any) -> list[tuple[str, bytes]]:
            result = await conn.execute(select(t.c.key, t.c.value).where(t.c.ns == ns))
            return [(key, bytes(value)) for key, value in result.all()]

        # Autocommit on PostgreSQL: reading the rows out is client work, and inside a
        # transaction a loaded client could overstay idle_in_transaction_session_timeout.
        return await self._call("scan", run, autocommit=self._pg)

    async def put_if_absent(
        self, ns: str, key: str, value: bytes, *, now: float, expires_at: float | None = None
    ) -> bool:
        """Atomically store ``value`` unless a live row exists; True if this call wrote it.

        A row is live when its ``expires_at`` is NULL or > ``now``. One statement: the insert
        wins outright, or the conflict branch replaces an expired row, or nothing happens.
        """
        t = self._table
        stmt = self._insert().values(ns=ns, key=key, value=value, expires_at=expires_at)
        stmt = stmt.on_conflict_do_update(
            index_elements=["ns", "key"],
            set_={"value": stmt.excluded.value, "expires_at": stmt.excluded.expires_at},
            where=t.c.expires_at.is_not(None) & (t.c.expires_at <= float(now)),
        ).returning(t.c.ns)

        async def run(conn: Any) -> bool:
            result = await conn.execute(stmt)
            return result.first() is not None

        # Autocommit on PostgreSQL: the winner's row lock ends with the statement, not one
        # COMMIT round trip later, so racers never wait on a client (lock_timeout) for it.
        return await self._call("put_if_absent", run, autocommit=self._pg)

    # -- leader leases ------------------------------------------------------------------------

    async def _check_fence(self, conn: Any, fence: Fence) -> None:
        from sqlalchemy import update

        t = self._table
        result = await conn.execute(
            update(t).where(t.c.ns == LEADER_NS, t.c.key == fence.name,
                            t.c.value == _lease_value(fence.epoch, fence.holder))
            .values(expires_at=t.c.expires_at))
        if result.rowcount != 1:
            raise FencedOut(f"database at {self._safe_url}: leader lease {fence.name!r} is no "
                            f"longer at epoch {fence.epoch}; nothing was written")

    async def acquire_leader(self, name: str, holder: str, *, now: float, ttl_s: float,
                             steal_from: str | None = None) -> int | None:
        """Take the lease with a new epoch if free, expired, ours or ``steal_from``'s."""
        from sqlalchemy import select, update

        t = self._table
        expires = float(now + ttl_s)

        async def run(conn: Any) -> int | None:
            row = (await conn.execute(select(t.c.value, t.c.expires_at).where(
                t.c.ns == LEADER_NS, t.c.key == name))).first()
            if row is None:
                stmt = self._insert().values(ns=LEADER_NS, key=name, expires_at=expires,
                                             value=_lease_value(1, holder))
                won = await conn.execute(stmt.on_conflict_do_nothing().returning(t.c.ns))
                return 1 if won.first() is not None else None
            seen = bytes(row.value)
            epoch, current = _parse_lease(seen)
            if row.expires_at > now and current not in (holder, steal_from):
                return None
            result = await conn.execute(
                update(t).where(t.c.ns == LEADER_NS, t.c.key == name, t.c.value == seen,
                                t.c.expires_at == row.expires_at)
                .values(value=_lease_value(epoch + 1, holder), expires_at=expires))
            return epoch + 1 if result.rowcount == 1 else None

        return await self._call("acquire_leader", run, autocommit=self._pg)

    async def _set_expiry(self, op: str, name: str, holder: str, epoch: int,
                          expires: float) -> bool:
        from sqlalchemy import update

        t = self._table

        async def run(conn: Any) -> bool:
            result = await conn.execute(
                update(t).where(t.c.ns == LEADER_NS, t.c.key == name,
                                t.c.value == _lease_value(epoch, holder))
                .values(expires_at=expires))
            return bool(result.rowcount == 1)

        return await self._call(op, run, autocommit=self._pg)

    async def renew_leader(self, name: str, holder: str, epoch: int, *, now: float,
                           ttl_s: float) -> bool:
        """Extend the lease if ``holder`` still holds it at ``epoch``."""
        return await self._set_expiry("renew_leader", name, holder, epoch, float(now + ttl_s))

    async def release_leader(self, name: str, holder: str, epoch: int) -> None:
        """Expire the lease now if still ``holder``'s at ``epoch`` (the epoch stays)."""
        await self._set_expiry("release_leader", name, holder, epoch, -1e300)

    async def read_leader(self, name: str) -> LeaderLease | None:
        from sqlalchemy import select

        t = self._table

        async def run(conn: Any) -> LeaderLease | None:
            row = (await conn.execute(select(t.c.value, t.c.expires_at).where(
                t.c.ns == LEADER_NS, t.c.key == name))).first()
            if row is None:
                return None
            epoch, holder = _parse_lease(bytes(row.value))
            return LeaderLease(holder, epoch, float(row.expires_at))

        return await self._call("read_leader", run, autocommit=self._pg)

    # -- helpers (tests) ----------------------------------------------------------------------

    async def drop_table(self) -> None:
        """Drop the table if it exists (tests and benchmarks clean up with it)."""
        t = self._table
        await self._call("drop_table",
                         lambda conn: conn.run_sync(lambda sync: t.drop(sync, checkfirst=True)))

    async def wipe(self) -> None:
        """Delete every row of the table (the table itself stays). Meant for tests."""
        from sqlalchemy import delete

        t = self._table
        await self._call("wipe", lambda conn: conn.execute(delete(t)))


def _lease_value(epoch: int, holder: str) -> bytes:
    return f"{epoch}\n{holder}".encode()


def _parse_lease(value: bytes) -> tuple[int, str]:
    epoch, _, holder = value.decode("utf-8").partition("\n")
    return int(epoch), holder
