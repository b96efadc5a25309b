"""Write a job into the outbox inside the application's own SQLAlchemy transaction.

The row is one ``INSERT`` on the caller's session or connection, in whatever transaction it
has open (or autobegins): the job exists if and only if that transaction commits. Nothing here
talks to the mesh, commits, or rolls back; the caller's transaction is the caller's.
On PostgreSQL the same statement also calls ``pg_notify`` on the table's channel, so a relay
listening there wakes the moment the transaction commits (a notification is delivered only on
commit, and a rolled-back transaction sends none).
"""

from __future__ import annotations

from typing import Any

from ..clock import SystemClock
from ..ids import IdSource
from ..producer import check_enqueue
from .table import DEFAULT_TABLE, channel, outbox_table

_ids = IdSource()  # OS-random ids, as a live producer's
_clock = SystemClock()
_pg_sql: dict[str, Any] = {}


def _dialect(target: Any) -> str:
    """The dialect name behind a Session/AsyncSession (its bind) or a Connection."""
    dialect = getattr(target, "dialect", None)
    if dialect is None:
        dialect = target.get_bind().dialect
    return str(dialect.name)


def make_row(name: str, data: Any, *, delay_s: float = 0, priority: int = 0,
             job_id: str | None = None, dedup_s: float | None = None,
             group: str | None = None, now: float | None = None) -> dict[str, Any]:
    """The outbox row of one job (every column but ``id`` and the claim), checked exactly as
    :meth:`Istos.enqueue` checks its arguments (InvalidJob / ConfigError)."""
    body, delay, prio, window, grp = check_enqueue(
        name, data, delay_s=delay_s, priority=priority, job_id=job_id, dedup_s=dedup_s,
        group=group)
    return {"queue": name, "job_id": job_id or _ids.new(), "body": body, "delay_s": delay,
            "priority": prio, "dedup_s": window, "job_group": grp,
            "created_at": _clock.now() if now is None else now}


def _statement(target: Any, table: str, row: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    t = outbox_table(table)
    if _dialect(target) != "postgresql":
        return t.insert(), row
    stmt = _pg_sql.get(table)
    if stmt is None:
        from sqlalchemy import text

        cols = ", ".join(row)
        # One statement, one round trip: the insert and the notification it makes on commit.
        stmt = text(f'WITH ins AS (INSERT INTO "{table}" ({cols}) VALUES '
                    f'({", ".join(":" + c for c in row)}) RETURNING id) '
                    "SELECT pg_notify(:ch, '') FROM ins")
        _pg_sql[table] = stmt
    return stmt, {**row, "ch": channel(table)}


async def enqueue(session: Any, name: str, data: Any, *, delay_s: float = 0,  # noqa: PLR0913
                  priority: int = 0, job_id: str | None = None,
                  dedup_s: float | None = None, group: str | None = None,
                  table: str = DEFAULT_TABLE) -> str:
    """Ask for a job on queue ``name`` inside ``session``'s transaction; returns its job id.

    ``session``: an ``AsyncSession`` or ``AsyncConnection``. The row is written in its current
    transaction (begun if none is); the job is enqueued by a relay once, and only if, that
    transaction commits. The arguments mean what they mean for :meth:`Istos.enqueue`
    (``delay_s`` counts from this call); the body is checked by the same function, so
    :class:`~istos.errors.InvalidJob` or :class:`~istos.errors.ConfigError` is raised before
    anything is written. Errors of the database itself are SQLAlchemy's, raised as they come.
    """
    row = make_row(name, data, delay_s=delay_s, priority=priority, job_id=job_id,
                   dedup_s=dedup_s, group=group)
    stmt, params = _statement(session, table, row)
    await session.execute(stmt, params)
    return str(row["job_id"])


def enqueue_sync(session: Any, name: str, data: Any, *, delay_s: float = 0,  # noqa: PLR0913
                 priority: int = 0, job_id: str | None = None,
                 dedup_s: float | None = None, group: str | None = None,
                 table: str = DEFAULT_TABLE) -> str:
    """:func:`enqueue` for a sync ``Session`` or ``Connection`` (Flask, scripts, threads)."""
    row = make_row(name, data, delay_s=delay_s, priority=priority, job_id=job_id,
                   dedup_s=dedup_s, group=group)
    stmt, params = _statement(session, table, row)
    session.execute(stmt, params)
    return str(row["job_id"])
