"""A transactional outbox: enqueue inside your own SQLAlchemy transaction.

:func:`enqueue` (``AsyncSession``/``AsyncConnection``) and :func:`enqueue_sync`
(``Session``/``Connection``) write one row to the outbox table in the caller's transaction and
return the job id; :class:`OutboxRelay` (``app.outbox_relay(url)``) turns committed rows into
jobs, one per row. A rolled-back transaction leaves no row, so no job; a committed one leaves a
row that stays until an owner accepted its job. See ``docs/outbox.md``.

Needs SQLAlchemy (``pip install istos-nb[sqlalchemy]``).
"""

from __future__ import annotations

from .enqueue import enqueue, enqueue_sync, make_row
from .relay import OutboxRelay
from .sql import SQLOutboxStore
from .store import MemoryOutbox, OutboxRow, OutboxStore
from .table import DEFAULT_TABLE, create_table, drop_table, metadata, outbox_table

__all__ = [
    # writing jobs in the caller's transaction
    "enqueue", "enqueue_sync", "make_row",
    # the table
    "metadata", "outbox_table", "create_table", "drop_table", "DEFAULT_TABLE",
    # the relay and its port
    "OutboxRelay", "OutboxStore", "OutboxRow", "SQLOutboxStore", "MemoryOutbox",
]
