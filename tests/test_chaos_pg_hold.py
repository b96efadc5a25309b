"""PostgreSQL HA leadership that a stuck leader cannot hold hostage (issue 24, item 1).

Real processes (``procs/ledger_node.py``) on a private PostgreSQL cluster this test starts
itself. The leader reaches the database through a user-space TCP relay the test controls; the
standby connects directly. The leader pauses right after its lease-renewal UPDATE (before
anything else it would send: inside the transaction when the statement opened one) and then:

- ``stop``: SIGSTOPs itself (a frozen process; the host keeps its sockets open);
- ``cut``: the relay swallows every byte both ways from then on, its sockets stay open (a
  silent partition: the server's TCP keepalives are answered by the relay's kernel, so only
  the server's idle/lock timeouts, or holding no transaction at all, free the lock).

Either way the standby must take over while the old leader is still stuck, and every job must
run: 0 lost, 0 stranded, 0 dead-lettered. Before the lease statements ran in autocommit, the
leader's backend sat ``idle in transaction`` holding the lease row and the standby's acquire
waited on it for as long as the leader stayed stuck.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from pathlib import Path

import pytest
from services import drop_postgres_table, free_port, postgres_url
from test_chaos import Proc, mesh_configs, produce
from test_chaos_ledger import NODE, check, node, postgres_store, produce_range, tally, wait_done

from istos import Istos, SQLAlchemyStoragePlugin
from istos.storage.base import LEADER_NS

__all__ = ["postgres_store"]  # the fixture, imported for pytest

HA_LEASE_S = 3.0  # not ledger_node's 1.5: a loaded machine must not flip leadership before the
# test arms the pause in the leader it started
STUCK_S = 12.0  # how long the old leader stays stuck: far longer than a takeover needs


class Relay:
    """A TCP relay to ``port``; ``cut()`` makes it swallow every byte, sockets left open."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.port = free_port()
        self.cut_off = False
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)

    def cut(self) -> None:
        self.cut_off = True

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.close()
            return
        self._writers += [writer, up_w]
        await asyncio.gather(self._pump(reader, up_w), self._pump(up_r, writer),
                             return_exceptions=True)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            if not self.cut_off:  # cut: read and drop, so no peer ever sees a close or RST
                writer.write(data)
                await writer.drain()
        if not self.cut_off:
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in self._writers:
            w.close()


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["stop", "cut"])
async def test_pg_leader_stuck_right_after_its_lease_update_cannot_block_takeover(
        fault, postgres_store, tmp_path, monkeypatch):
    store = postgres_store
    assert store.pg is not None
    relay = Relay(store.pg.port)
    await relay.start()
    configs, prefix = mesh_configs(4), f"pgh-{uuid.uuid4().hex[:8]}"
    pause = tmp_path / "pause"
    monkeypatch.setenv("ISTOS_HA_LEASE_S", str(HA_LEASE_S))
    monkeypatch.setenv("ISTOS_TEST_LEASE_PAUSE", f"{fault}:{pause}")
    via_relay = store.url.replace(f":{store.pg.port}/", f":{relay.port}/")
    leader = Proc("replica", configs[0], prefix, via_relay, store.ns, node=NODE)
    leader.start()
    monkeypatch.delenv("ISTOS_TEST_LEASE_PAUSE")
    standby = node("replica", configs[1], prefix, store)
    ledger = tmp_path / "ledger.jsonl"
    worker = node("worker", configs[2], prefix, store, ledger)
    producer = Istos(zenoh=configs[3], prefix=prefix, node_id="producer", request_timeout_s=2.0)
    try:
        await leader.expect("LEADING", 30)
        standby.start()
        await standby.expect("STANDBY", 30)
        worker.start()
        await worker.ready()
        async with producer.serving():
            await produce(producer, 50)
            await wait_done([ledger], 50, 30)
            assert leader.last_role == "LEADING", "leadership moved before the test began"
            Path(f"{pause}.arm").touch()
            await leader.expect("PAUSED", 10)
            stuck_at = time.monotonic()
            if fault == "cut":
                relay.cut()
                Path(f"{pause}.cut").touch()
            await standby.expect("LEADING", STUCK_S)  # while the old leader is still stuck
            takeover_s = time.monotonic() - stuck_at
            await asyncio.wait_for(produce_range(producer, 50, 150), 60)
            await wait_done([ledger], 150, 40)
            if fault == "stop":
                assert leader.proc is not None
                leader.proc.send_signal(signal.SIGCONT)
            # The old leader finds its lease gone (or unrenewable through the cut) and stands by.
            await leader.expect("STANDBY", 30)
            assert standby.last_role == "LEADING"
    finally:
        for p in (leader, standby, worker):
            if p.proc is not None and p.proc.poll() is None:
                p.proc.send_signal(signal.SIGCONT)
            p.kill()
        with contextlib.suppress(Exception):
            await relay.close()
    check(await tally(store, [ledger], 150),
          f"PG leader {fault} after its lease UPDATE (takeover {takeover_s:.2f} s, "
          f"ha_lease_s {HA_LEASE_S})")


@pytest.mark.postgres
async def test_a_session_left_idle_in_transaction_on_the_lease_row_is_ended_by_the_server():
    """A client that took the lease row's lock in a transaction and then went quiet (frozen,
    cut off: the server cannot tell) is ended by ``idle_in_transaction_session_timeout``, so
    the next acquirer gets the row instead of waiting on the lock for as long as it lasts."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    url, table = postgres_url(), f"hold_{uuid.uuid4().hex[:8]}"
    stuck = SQLAlchemyStoragePlugin(url, table=table, hold_timeout_s=0.5)
    # The other side waits for locks up to 3 s: the stuck session (idle since before the
    # wait began, limit 0.5 s) is ended well before that, whatever the machine's load.
    other = SQLAlchemyStoragePlugin(url, table=table, hold_timeout_s=3.0, op_timeout_s=10.0)
    try:
        await stuck.open()
        assert await stuck.acquire_leader("ha:q", "a", now=0.0, ttl_s=1.0) == 1
        conn = await stuck._ensure_engine().connect()
        tx = await conn.begin()
        await conn.execute(text(f'UPDATE "{table}" SET expires_at = expires_at '
                                "WHERE ns = :ns"), {"ns": LEADER_NS})
        # ...and now this session just sits there, holding the row lock
        assert await other.acquire_leader("ha:q", "b", now=10.0, ttl_s=1.0) == 2
        with pytest.raises(DBAPIError):  # the server ended the idle transaction's session
            await tx.commit()
        with contextlib.suppress(Exception):
            await conn.close()
        lease = await other.read_leader("ha:q")
        assert lease is not None and (lease.holder, lease.epoch) == ("b", 2)
    finally:
        await stuck.close()
        await other.close()
        await drop_postgres_table(url, table)


async def probe(app: Istos, *, until: float, step: float, out: list[tuple[float, bool]]) -> None:
    """Until wall time ``until``, send one ``stats`` request every ``step`` s, each on its own
    (not waiting for the previous one); record (wall time sent, answered ok)."""

    async def one(sent: float) -> None:
        try:
            await app.client("q").call("stats", timeout_s=1.0)
            out.append((sent, True))
        except Exception:
            out.append((sent, False))

    tasks = []
    while time.time() < until:
        tasks.append(asyncio.create_task(one(time.time())))
        await asyncio.sleep(step)  # the probe's cadence, not a synchronisation
    await asyncio.gather(*tasks)


@pytest.mark.slow
async def test_pg_leader_cut_from_the_store_answers_nothing_once_its_lease_lapsed(
        postgres_store, tmp_path, monkeypatch):
    """The only replica loses its database link (a silent relay): it cannot renew. Every
    renewal that counted was asked before the cut, so its lease ran out by cut + ha_lease_s:
    no request sent after that may get an ok reply, not even a read from its memory."""
    store = postgres_store
    assert store.pg is not None
    relay = Relay(store.pg.port)
    await relay.start()
    configs, prefix = mesh_configs(2), f"pgl-{uuid.uuid4().hex[:8]}"
    via_relay = store.url.replace(f":{store.pg.port}/", f":{relay.port}/")
    monkeypatch.setenv("ISTOS_HA_LEASE_S", str(HA_LEASE_S))
    leader = Proc("replica", configs[0], prefix, via_relay, store.ns, node=NODE)
    leader.start()
    producer = Istos(zenoh=configs[1], prefix=prefix, node_id="producer", request_timeout_s=2.0)
    answers: list[tuple[float, bool]] = []
    try:
        await leader.expect("LEADING", 30)
        async with producer.serving():
            await produce(producer, 20)
            start = time.time()
            probing = asyncio.create_task(probe(producer, until=start + 2 + 3 * HA_LEASE_S,
                                                step=0.05, out=answers))
            await asyncio.sleep(2.0)  # probes answered while the link is up
            cut_at = time.time()
            relay.cut()
            await asyncio.wait_for(probing, 30)
            await leader.expect("STANDBY", 30)  # it noticed, and stood down
    finally:
        leader.kill()
        with contextlib.suppress(Exception):
            await relay.close()
    before = [ok for t, ok in answers if t < cut_at - 0.2]
    late = sorted(t - cut_at for t, ok in answers if ok and t > cut_at + HA_LEASE_S)
    print(f"\nprobes: {len(answers)}; ok before the cut {sum(before)}/{len(before)}; "
          f"last ok sent {max((t - cut_at for t, ok in answers if ok), default=0):.2f} s "
          "after the cut")
    assert before and all(before)
    assert not late, f"a lapsed leader answered {len(late)} request(s) sent {late[0]:.2f} s " \
                     "after the cut"
