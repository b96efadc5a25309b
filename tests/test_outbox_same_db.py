"""The outbox in the queue's own database: moving rows into the queue is one transaction.

When the relay's app owns the queue and stores its jobs (``SQLAlchemyStoragePlugin``) in the
database that holds the outbox, the owner's write of the new jobs also deletes their rows, in
one transaction. The proof is a write that cannot commit: a trigger refuses the rows' delete,
and then no job may exist either (with two transactions, the jobs would be stored and the
rows left behind); once the trigger is gone, each row runs once. On the shared PostgreSQL,
under a private table pair removed afterwards (SQLite keeps the two steps: ``same_database``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from services import postgres_url
from zenoh_util import wait_until

from istos import Istos, SQLAlchemyStoragePlugin, outbox
from istos.transport.local import LocalMesh

BOUND_S = 20.0
Q = "jobs/report"


@dataclass
class Db:
    url: str
    table: str  # the outbox
    kv: str  # the queue's storage table
    engine: Any
    postgres: bool

    async def count(self) -> int:
        from sqlalchemy import func, select

        t = outbox.outbox_table(self.table)
        async with self.engine.connect() as conn:
            return int((await conn.execute(select(func.count()).select_from(t))).scalar_one())

    async def refuse_deletes(self, on: bool) -> None:
        """A trigger that makes every delete of an outbox row fail (its transaction with it)."""
        from sqlalchemy import text

        name = f"{self.table}_refuse"
        if self.postgres:
            stmts = [f"DROP TRIGGER IF EXISTS {name} ON {self.table}"]
            if on:
                stmts += [f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger AS $$ BEGIN "
                          "RAISE EXCEPTION 'outbox deletes refused'; END $$ LANGUAGE plpgsql",
                          f"CREATE TRIGGER {name} BEFORE DELETE ON {self.table} FOR EACH ROW "
                          f"EXECUTE FUNCTION {name}()"]
            else:
                stmts += [f"DROP FUNCTION IF EXISTS {name}()"]
        else:
            stmts = [f"DROP TRIGGER IF EXISTS {name}"]
            if on:
                stmts.append(f"CREATE TRIGGER {name} BEFORE DELETE ON {self.table} BEGIN "
                             "SELECT RAISE(ABORT, 'outbox deletes refused'); END")
        async with self.engine.begin() as conn:
            for stmt in stmts:
                await conn.execute(text(stmt))


@pytest.fixture(params=["postgres"])
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Db]:
    from sqlalchemy.ext.asyncio import create_async_engine

    tag = uuid.uuid4().hex[:12]  # parallel runs never share a table
    pg = request.param == "postgres"
    url = postgres_url() if pg else f"sqlite+aiosqlite:///{tmp_path / 'app.db'}"
    engine = create_async_engine(url)
    db = Db(url, f"ob_{tag}", f"kv_{tag}", engine, pg)
    await outbox.create_table(engine, db.table)
    try:
        yield db
    finally:
        await db.refuse_deletes(False)
        await outbox.drop_table(engine, db.table)
        cleaner = SQLAlchemyStoragePlugin(url, table=db.kv)
        await cleaner.drop_table()
        await cleaner.close()
        await engine.dispose()


def owner_app(db: Db) -> tuple[Istos, list[Any], asyncio.Event]:
    """An owner of Q storing its jobs in ``db``, relaying ``db``'s outbox, running what comes."""
    app = Istos(SQLAlchemyStoragePlugin(db.url, table=db.kv), transport=LocalMesh().transport("o"))
    app.queue(Q, sweep_interval_s=0.05)
    ran: list[Any] = []
    changed = asyncio.Event()

    @app.worker(Q, poll_interval_s=0.05)
    async def work(job: Any) -> None:
        ran.append(job)
        changed.set()

    return app, ran, changed


async def test_rows_move_in_the_owners_own_transaction(db: Db) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    app, ran, changed = owner_app(db)
    relay = app.outbox_relay(db.url, table=db.table, poll_s=0.05)
    async with app.serving():
        async with AsyncSession(db.engine) as session, session.begin():
            ids = [await outbox.enqueue(session, Q, {"i": i}, table=db.table) for i in range(20)]
        await wait_until(lambda: len(ran) == 20, BOUND_S, "every row ran")
        await wait_until(lambda: relay.sent == 20, BOUND_S, "every row accounted")
        assert sorted(j["i"] for j in ran) == list(range(20))
        assert relay.atomic == 20 and (await relay.stats())["atomic"] == 20
        assert await db.count() == 0
        for jid in ids:
            assert (await app.result(Q, jid))["state"] in ("done", "unknown")


async def test_a_delete_that_fails_stores_no_job(db: Db) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    app, ran, changed = owner_app(db)
    relay = app.outbox_relay(db.url, table=db.table, poll_s=0.05)
    await db.refuse_deletes(True)
    async with app.serving():
        async with AsyncSession(db.engine) as session, session.begin():
            ids = [await outbox.enqueue(session, Q, {"i": i}, table=db.table) for i in range(5)]
        await wait_until(lambda: relay.failures >= 2, BOUND_S, "two rounds failed")
        # The jobs' write failed with the delete: no job exists, nothing ran, the rows wait.
        for jid in ids:
            assert (await app.result(Q, jid))["state"] == "unknown"
        assert ran == [] and relay.atomic == 0 and await db.count() == 5
        await db.refuse_deletes(False)
        await wait_until(lambda: len(ran) == 5, BOUND_S, "each row ran once the delete could")
        await wait_until(lambda: relay.sent == 5, BOUND_S, "every row accounted")
        assert sorted(j["i"] for j in ran) == list(range(5)) and relay.atomic == 5
        assert await db.count() == 0


async def test_another_database_keeps_the_two_step_path(db: Db, tmp_path: Path) -> None:
    """Jobs stored elsewhere (here in memory): the rows move by send, then delete."""
    from sqlalchemy.ext.asyncio import AsyncSession

    app = Istos(transport=LocalMesh().transport("o"))
    app.queue(Q)
    ran: list[Any] = []

    @app.worker(Q, poll_interval_s=0.05)
    async def work(job: Any) -> None:
        ran.append(job)

    relay = app.outbox_relay(db.url, table=db.table, poll_s=0.05)
    async with app.serving():
        async with AsyncSession(db.engine) as session, session.begin():
            await outbox.enqueue(session, Q, {"i": 1}, table=db.table)
        await wait_until(lambda: relay.sent == 1 and len(ran) == 1, BOUND_S, "the row ran")
        assert relay.atomic == 0


@pytest.mark.fast
def test_only_the_same_postgresql_database_is_the_same() -> None:
    from istos.outbox.sql import SQLOutboxStore

    store = SQLOutboxStore("postgresql+asyncpg://app:pw@db:5432/app", "outbox")
    assert store.same_database("postgresql+asyncpg://app:other@db/app")  # password, port
    assert store.same_database("postgresql+psycopg://app@db:5432/app")  # driver
    assert not store.same_database("postgresql+asyncpg://app@db:5432/other")
    assert not store.same_database("postgresql+asyncpg://app@elsewhere:5432/app")
    assert not store.same_database("postgresql+asyncpg://ops@db:5432/app")
    lite = SQLOutboxStore("sqlite+aiosqlite:////tmp/app.db", "outbox")
    assert not lite.same_database("sqlite+aiosqlite:////tmp/app.db")
