"""The transactional outbox in one process, on a real PostgreSQL and a real SQLite file: a row
exists iff its transaction committed, becomes one job, and waits while no owner answers.
(Crashes of real relay processes: test_outbox_procs.py.)"""

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

from istos import ConfigError, InvalidJob, Istos, StorageUnavailable, outbox
from istos.transport.local import LocalMesh

BOUND_S = 20.0
Q = "jobs/email"


@dataclass
class Db:
    url: str  # async URL (the relay's, and the app's engine)
    table: str
    engine: Any  # an AsyncEngine on url

    async def count(self) -> int:
        from sqlalchemy import func, select

        t = outbox.outbox_table(self.table)
        async with self.engine.connect() as conn:
            return int((await conn.execute(select(func.count()).select_from(t))).scalar_one())


@pytest.fixture(params=["sqlite", "postgres"])
async def db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Db]:
    from sqlalchemy.ext.asyncio import create_async_engine

    table = f"ob_{uuid.uuid4().hex[:12]}"  # parallel runs never share a table
    if request.param == "postgres":
        url = postgres_url()
    else:
        url = f"sqlite+aiosqlite:///{tmp_path / 'app.db'}"
    engine = create_async_engine(url)
    await outbox.create_table(engine, table)
    try:
        yield Db(url, table, engine)
    finally:
        await outbox.drop_table(engine, table)
        await engine.dispose()


def worker_app(mesh: LocalMesh, name: str = "owner") -> tuple[Istos, list[Any], asyncio.Event]:
    """An owner of Q with a worker that records every body it runs."""
    app = Istos(transport=mesh.transport(name))
    app.queue(Q, sweep_interval_s=0.05)
    ran: list[Any] = []
    changed = asyncio.Event()

    @app.worker(Q, poll_interval_s=0.05)
    async def work(job: Any) -> None:
        ran.append(job)
        changed.set()

    return app, ran, changed


async def until(pred: Any, changed: asyncio.Event, what: str) -> None:
    """Wait (bounded) until ``pred()`` holds, re-checking whenever ``changed`` fires."""
    async def loop() -> None:
        while not pred():
            changed.clear()
            await changed.wait()
    try:
        await asyncio.wait_for(loop(), BOUND_S)
    except asyncio.TimeoutError:
        raise AssertionError(f"not within {BOUND_S}s: {what}") from None


async def test_invalid_body_raises_before_anything_is_written(db: Db) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    async with AsyncSession(db.engine) as session, session.begin():
        with pytest.raises(InvalidJob):
            await outbox.enqueue(session, Q, {"x": object()}, table=db.table)
        with pytest.raises(ConfigError):
            await outbox.enqueue(session, "bad//name", {}, table=db.table)
        with pytest.raises(ConfigError):  # a dedup window needs the caller's id, as enqueue's
            await outbox.enqueue(session, Q, {}, dedup_s=5, table=db.table)
        with pytest.raises(InvalidJob):
            await outbox.enqueue(session, Q, b"x" * (4 << 20), table=db.table)
    assert await db.count() == 0


async def test_rollback_leaves_no_job_and_commit_runs_once(db: Db) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    mesh = LocalMesh()
    app, ran, changed = worker_app(mesh)
    relay = app.outbox_relay(db.url, table=db.table, poll_s=0.05)
    async with app.serving():
        async with AsyncSession(db.engine) as session:
            async with session.begin():
                lost = await outbox.enqueue(session, Q, {"n": "rolled back"}, table=db.table)
                await session.rollback()
            async with session.begin():
                kept = await outbox.enqueue(session, Q, {"n": "committed"}, table=db.table,
                                            priority=3)
        async with db.engine.connect() as conn:  # the connection form, committed
            await outbox.enqueue(conn, Q, {"n": "conn"}, job_id="conn-1", table=db.table)
            await conn.commit()
        await until(lambda: len(ran) >= 2, changed, "both committed rows ran")
        await wait_until(lambda: relay.sent == 2, BOUND_S, "the relay deleted what it sent")
        assert sorted(j["n"] for j in ran) == ["committed", "conn"]
        assert (await app.result(Q, lost))["state"] == "unknown"
        assert (await app.result(Q, kept))["state"] in ("done", "unknown")
        stats = await relay.stats()
        assert stats["depth"] == 0 and stats["oldest_age_s"] is None and stats["sent"] == 2
    assert await db.count() == 0


async def test_rows_wait_while_no_owner_answers_then_run_in_order(db: Db) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    mesh = LocalMesh()
    relay_app = Istos(transport=mesh.transport("relay"), request_timeout_s=0.2)
    relay = relay_app.outbox_relay(db.url, table=db.table, poll_s=0.05)
    async with relay_app.serving():
        async with AsyncSession(db.engine) as session, session.begin():
            ids = [await outbox.enqueue(session, Q, {"i": i}, table=db.table)
                   for i in range(30)]
        # Nobody owns the queue: rounds fail and release their rows, which stay.
        await wait_until(lambda: relay.failures >= 2, BOUND_S, "two failed rounds")
        stats = await relay.stats()
        assert stats["depth"] == 30 and stats["oldest_age_s"] >= 0 and relay.sent == 0
        owner, ran, changed = worker_app(mesh)
        async with owner.serving():
            await until(lambda: len(ran) == 30, changed, "all rows ran once the owner came")
            assert [j["i"] for j in ran] == list(range(30))  # id order kept
            for jid in ids:
                assert (await owner.result(Q, jid))["state"] in ("done", "unknown")
            await wait_until(lambda: relay.sent == 30, BOUND_S, "every sent row deleted")
    assert await db.count() == 0


async def test_delay_counts_from_the_write_and_group_travels(db: Db) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    mesh = LocalMesh()
    app, ran, changed = worker_app(mesh)
    app.outbox_relay(db.url, table=db.table, poll_s=0.05)
    async with app.serving():
        async with AsyncSession(db.engine) as session, session.begin():
            jid = await outbox.enqueue(session, Q, {"late": True}, delay_s=3600,
                                       group="tenant-1", table=db.table)
            await outbox.enqueue(session, Q, {"late": False}, table=db.table)
        await until(lambda: len(ran) == 1, changed, "the undelayed row ran")
        await until_state(app, jid, "ready")
        assert ran == [{"late": False}]


async def until_state(app: Istos, jid: str, state: str) -> None:
    for _ in range(400):
        if (await app.result(Q, jid))["state"] == state:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {jid} never reached {state}")


def test_sync_twin_on_a_sync_session(tmp_path: Path) -> None:
    from sqlalchemy import create_engine, func, select
    from sqlalchemy.orm import Session

    table = f"ob_{uuid.uuid4().hex[:12]}"
    engine = create_engine(f"sqlite:///{tmp_path / 'sync.db'}")
    outbox.create_table(engine, table)
    t = outbox.outbox_table(table)
    with Session(engine) as session:
        with session.begin():
            jid = outbox.enqueue_sync(session, Q, {"a": 1}, job_id="order-7", table=table)
        with pytest.raises(InvalidJob), session.begin():
            outbox.enqueue_sync(session, Q, {1, 2}, table=table)
        session.begin()
        outbox.enqueue_sync(session, Q, {"a": 2}, table=table)
        session.rollback()
    with engine.connect() as conn:
        rows = conn.execute(select(t.c.job_id, t.c.queue)).all()
        outbox.enqueue_sync(conn, Q, {"a": 3}, table=table)
        conn.rollback()
        assert conn.execute(select(func.count()).select_from(t)).scalar_one() == 1
    assert jid == "order-7" and [tuple(r) for r in rows] == [("order-7", Q)]
    outbox.drop_table(engine, table)


def test_default_metadata_holds_the_default_table() -> None:
    assert outbox.DEFAULT_TABLE in outbox.metadata.tables
    with pytest.raises(ConfigError):
        outbox.outbox_table("bad; drop table x")


async def test_postgres_commit_wakes_the_relay_through_notify(tmp_path: Path) -> None:
    """The relay's poll is 60 s, above the bound: only the commit's NOTIFY can wake it."""
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    url, table = postgres_url(), f"ob_{uuid.uuid4().hex[:12]}"
    engine = create_async_engine(url)
    mesh = LocalMesh()
    app, ran, changed = worker_app(mesh)
    app.outbox_relay(url, table=table, poll_s=60)
    try:
        async with app.serving():
            for n in range(3):  # each commit wakes it again (the first after a quiet round)
                await asyncio.sleep(0.2)  # let the relay finish its round and go idle
                async with AsyncSession(engine) as session, session.begin():
                    await outbox.enqueue(session, Q, {"n": n}, table=table)
                await until(lambda n=n: len(ran) == n + 1, changed, f"row {n} ran")
    finally:
        await outbox.drop_table(engine, table)
        await engine.dispose()


@pytest.mark.timeout(120)
async def test_istos_metrics_reports_the_outbox_depth_and_oldest_age(tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
    from zenoh_util import free_port, isolated_configs, unique_prefix

    url, table = postgres_url(), f"ob_{uuid.uuid4().hex[:12]}"
    engine = create_async_engine(url)
    await outbox.create_table(engine, table)
    async with AsyncSession(engine) as session, session.begin():
        for i in range(7):
            await outbox.enqueue(session, Q, {"i": i}, table=table)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "istos", "metrics", "absent", "--port", str(port), "--zenoh",
         json.dumps(isolated_configs(1)[0]), "--prefix", unique_prefix(), "--budget", "0.2",
         "--outbox", url, "--outbox-table", table],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        assert "/metrics" in line
        text = await asyncio.to_thread(lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode())
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in text_string_to_metric_families(text) for s in family.samples}
        label = (("table", table),)
        assert samples[("istos_outbox_up", label)] == 1.0
        assert samples[("istos_outbox_depth", label)] == 7.0
        assert samples[("istos_outbox_claimed", label)] == 0.0
        assert samples[("istos_outbox_oldest_age_seconds", label)] > 0.0
    finally:
        proc.terminate()
        _, err = await asyncio.to_thread(proc.communicate, None, 30)
        await outbox.drop_table(engine, table)
        await engine.dispose()
    assert proc.returncode == 0, err


async def test_sync_twin_on_postgres_notifies_on_commit_only() -> None:
    """A sync Session (psycopg) writes the row and the NOTIFY in its transaction: a rolled-back
    one leaves neither, a committed one both."""
    import asyncpg
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url
    from sqlalchemy.orm import Session

    from istos.outbox.table import channel

    url, table = make_url(postgres_url()), f"ob_{uuid.uuid4().hex[:12]}"
    engine = create_engine(url.set(drivername="postgresql+psycopg"))
    outbox.create_table(engine, table)
    listener = await asyncpg.connect(url.set(drivername="postgresql").render_as_string(False))
    heard: asyncio.Queue[str] = asyncio.Queue()
    await listener.add_listener(channel(table), lambda *args: heard.put_nowait(args[2]))

    def write(commit: bool) -> str:
        with Session(engine) as session:
            session.begin()
            jid = outbox.enqueue_sync(session, Q, {"commit": commit}, table=table)
            session.commit() if commit else session.rollback()
            return jid

    try:
        await asyncio.to_thread(write, False)
        kept = await asyncio.to_thread(write, True)
        await asyncio.wait_for(heard.get(), BOUND_S)  # the commit's notification
        await listener.execute("SELECT 1")  # a round trip delivers anything else pending
        assert heard.empty()
        with engine.connect() as conn:
            t = outbox.outbox_table(table)
            from sqlalchemy import select
            assert [r.job_id for r in conn.execute(select(t.c.job_id))] == [kept]
    finally:
        await listener.close()
        outbox.drop_table(engine, table)
        engine.dispose()


async def test_relay_rides_out_a_database_crash_and_listens_again() -> None:
    """A private PostgreSQL SIGKILLed under a running relay, then restarted: afterwards the
    relay claims again (its pooled connection died with the server) and is woken again (its
    LISTEN connection comes back; its poll, 60 s, is above the bound)."""
    from services import PrivatePostgres
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    pg = PrivatePostgres()
    pg.start()
    table = f"ob_{uuid.uuid4().hex[:12]}"
    mesh = LocalMesh()
    app, ran, changed = worker_app(mesh)
    relay = app.outbox_relay(pg.url, table=table, poll_s=60, op_timeout_s=1.0)
    engine = create_async_engine(pg.url, pool_pre_ping=True)

    async def commit(n: int) -> None:
        async with AsyncSession(engine) as session, session.begin():
            await outbox.enqueue(session, Q, {"n": n}, table=table)

    try:
        async with app.serving():
            await commit(0)
            await until(lambda: len(ran) == 1, changed, "the first row ran")
            pg.kill()
            with pytest.raises(StorageUnavailable):
                await relay.stats()
            await asyncio.to_thread(pg.start)
            await commit(1)
            await until(lambda: len(ran) == 2, changed, "the row committed after the restart")
            assert [j["n"] for j in ran] == [0, 1]
    finally:
        await engine.dispose()
        pg.remove()


async def test_a_relay_of_some_queues_leaves_the_others_rows(db: Db) -> None:
    from sqlalchemy.ext.asyncio import AsyncSession

    mesh = LocalMesh()
    app, ran, changed = worker_app(mesh)
    relay = app.outbox_relay(db.url, table=db.table, queues=[Q], poll_s=0.05)
    async with app.serving():
        async with AsyncSession(db.engine) as session, session.begin():
            await outbox.enqueue(session, "jobs/other", {"n": "other"}, table=db.table)
            await outbox.enqueue(session, Q, {"n": "mine"}, table=db.table)
        await until(lambda: len(ran) == 1, changed, "the relayed queue's row ran")
        await wait_until(lambda: relay.sent == 1, BOUND_S, "its row deleted")
        stats = await relay.stats()
        assert stats["depth"] == 1 and stats["claimed"] == 0 and ran == [{"n": "mine"}]


async def test_a_row_the_owner_refuses_holds_up_no_other(db: Db) -> None:
    """A row written around outbox.enqueue (an id over the wire's limit) is refused by the
    owner: it stays in the table, and the rows after it in its queue still run, in order."""
    from sqlalchemy.ext.asyncio import AsyncSession

    mesh = LocalMesh()
    app, ran, changed = worker_app(mesh)
    relay = app.outbox_relay(db.url, table=db.table, poll_s=0.05)
    t = outbox.outbox_table(db.table)
    async with app.serving():
        async with AsyncSession(db.engine) as session, session.begin():
            await outbox.enqueue(session, Q, {"n": 0}, table=db.table)
            await session.execute(t.insert(), {**outbox.make_row(Q, {"n": "bad"}),
                                               "job_id": "x" * 250})
            for n in (1, 2):
                await outbox.enqueue(session, Q, {"n": n}, table=db.table)
        await until(lambda: len(ran) == 3, changed, "the good rows ran")
        await wait_until(lambda: relay.sent == 3, BOUND_S, "the good rows deleted")
        assert [j["n"] for j in ran] == [0, 1, 2]
        stats = await relay.stats()
        assert stats["depth"] == 1 and stats["refused"] == 1


def test_the_docs_complete_script_runs(tmp_path: Path) -> None:
    """docs/outbox.md's complete script, run as written in a fresh directory."""
    import subprocess
    import sys

    doc = (Path(__file__).parent.parent / "docs" / "outbox.md").read_text()
    section = doc.split("## A complete script (SQLite)", 1)[1]
    script = section.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "shop.py").write_text(script)
    done = subprocess.run([sys.executable, "shop.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["sending to a@example.com"]
