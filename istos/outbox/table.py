"""The outbox table: one row per job an application's transaction asked for.

A row is written by :func:`istos.outbox.enqueue` inside the application's transaction, so it
exists if and only if that transaction committed. The relay (:mod:`istos.outbox.relay`) claims
rows, enqueues each with the row's job id and deletes it once the owner accepted it.

Schema (default name ``istos_outbox``; PostgreSQL types, SQLite's in comments)::

    id            BIGSERIAL PRIMARY KEY      -- INTEGER PRIMARY KEY AUTOINCREMENT on SQLite
    queue         VARCHAR(255)      NOT NULL -- the queue's name
    job_id        VARCHAR(255)      NOT NULL -- chosen at write time: a re-send is a no-op
    body          BYTEA             NOT NULL -- the job body, msgpack (BLOB)
    delay_s       DOUBLE PRECISION  NOT NULL -- counted from created_at
    priority      INTEGER           NOT NULL
    dedup_s       DOUBLE PRECISION  NULL     -- NULL: the relay's default window
    job_group     VARCHAR(255)      NULL
    created_at    DOUBLE PRECISION  NOT NULL -- writer's clock, epoch seconds
    claim_token   VARCHAR(64)       NULL     -- the relay holding the row, if any
    claimed_until DOUBLE PRECISION  NULL     -- when that claim lapses (relay's clock)

    CREATE INDEX ix_<table>_claimed_until ON <table> (claimed_until);

:data:`metadata` holds the default table, for Alembic's ``target_metadata`` (or pass it to
``MetaData.create_all``); :func:`outbox_table` builds the same table under another name.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError

try:
    from sqlalchemy import (
        BigInteger,
        Column,
        Double,
        Index,
        Integer,
        LargeBinary,
        MetaData,
        String,
        Table,
    )
except ImportError as exc:  # pragma: no cover - the extra is missing
    raise ImportError("istos.outbox needs SQLAlchemy: pip install istos-nb[sqlalchemy]") from exc

DEFAULT_TABLE = "istos_outbox"

metadata = MetaData()
"""The default outbox table's ``MetaData`` (Alembic's ``target_metadata`` may include it)."""

_tables: dict[str, Table] = {}


def _build(name: str, meta: MetaData) -> Table:
    return Table(
        name, meta,
        # SQLite autoincrements only an INTEGER PRIMARY KEY; PostgreSQL gets a BIGSERIAL.
        Column("id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True,
               autoincrement=True),
        Column("queue", String(255), nullable=False),
        Column("job_id", String(255), nullable=False),
        Column("body", LargeBinary, nullable=False),
        Column("delay_s", Double, nullable=False),
        Column("priority", Integer, nullable=False),
        Column("dedup_s", Double, nullable=True),
        Column("job_group", String(255), nullable=True),
        Column("created_at", Double, nullable=False),
        Column("claim_token", String(64), nullable=True),
        Column("claimed_until", Double, nullable=True),
        Index(f"ix_{name}_claimed_until", "claimed_until"),
    )


def outbox_table(name: str = DEFAULT_TABLE) -> Table:
    """The outbox ``Table`` named ``name`` (the default one lives in :data:`metadata`; any
    other in a ``MetaData`` of its own). Raises :class:`ConfigError` for a bad name."""
    table = _tables.get(name)
    if table is not None:
        return table
    # At most 40 characters: its index's name then stays within PostgreSQL's 63.
    if not isinstance(name, str) or not name.replace("_", "").isalnum() or len(name) > 40:
        raise ConfigError(f"outbox table name must be letters, digits and '_' (at most 40), "
                          f"got {name!r}")
    table = _build(name, metadata if name == DEFAULT_TABLE else MetaData())
    _tables[name] = table
    return table


outbox_table(DEFAULT_TABLE)  # in `metadata` from import on, for Alembic's autogenerate


def channel(name: str) -> str:
    """The LISTEN/NOTIFY channel of outbox table ``name`` (PostgreSQL)."""
    return f"{name}_ready"


def create_table(engine: Any, table: str = DEFAULT_TABLE) -> Any:
    """Create the outbox table (and its index) unless it exists.

    ``engine``: a sync ``Engine``/``Connection`` (returns None), or an ``AsyncEngine`` (returns
    an awaitable: ``await create_table(async_engine)``).
    """
    t = outbox_table(table)
    if hasattr(engine, "sync_engine"):  # AsyncEngine
        async def create() -> None:
            async with engine.begin() as conn:
                await conn.run_sync(t.create, checkfirst=True)
        return create()
    if hasattr(engine, "begin") and not hasattr(engine, "in_transaction"):  # Engine
        with engine.begin() as conn:
            t.create(conn, checkfirst=True)
        return None
    t.create(engine, checkfirst=True)
    return None


def drop_table(engine: Any, table: str = DEFAULT_TABLE) -> Any:
    """Drop the outbox table if it exists (same ``engine`` forms as :func:`create_table`)."""
    t = outbox_table(table)
    if hasattr(engine, "sync_engine"):
        async def drop() -> None:
            async with engine.begin() as conn:
                await conn.run_sync(t.drop, checkfirst=True)
        return drop()
    if hasattr(engine, "begin") and not hasattr(engine, "in_transaction"):
        with engine.begin() as conn:
            t.drop(conn, checkfirst=True)
        return None
    t.drop(engine, checkfirst=True)
    return None
