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
from services import free_port
from test_chaos import Proc, mesh_configs, produce
from test_chaos_ledger import NODE, check, node, postgres_store, produce_range, tally, wait_done

from istos import Istos

__all__ = ["postgres_store"]  # the fixture, imported for pytest
pytestmark = pytest.mark.slow

HA_LEASE_S = 1.5  # ledger_node's default
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


@pytest.mark.parametrize("fault", ["stop", "cut"])
async def test_pg_leader_stuck_right_after_its_lease_update_cannot_block_takeover(
        fault, postgres_store, tmp_path, monkeypatch):
    store = postgres_store
    assert store.pg is not None
    relay = Relay(store.pg.port)
    await relay.start()
    configs, prefix = mesh_configs(4), f"pgh-{uuid.uuid4().hex[:8]}"
    pause = tmp_path / "pause"
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
