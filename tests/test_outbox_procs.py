"""The outbox across real processes and crashes, on PostgreSQL and SQLite: relays SIGKILLed
between the owner's accept and the delete and at random moments, two relays on one table, and
an owner down for 10 s while 1,000 rows are committed. The independent ledger is the worker's
file (one fsynced line per job run): every committed row runs, none twice."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from services import postgres_url
from test_chaos import Proc, mesh_configs

from istos import outbox

NODE = str(Path(__file__).parent / "procs" / "outbox_node.py")
Q = "jobs/email"
pytestmark = pytest.mark.slow


class Rig:
    """An outbox table, the owner process (owner + worker) and relay processes on one mesh."""

    def __init__(self, url: str, tmp: Path, relays: int = 1) -> None:
        self.url, self.tmp = url, tmp
        self.table = f"ob_{uuid.uuid4().hex[:12]}"
        self.prefix = f"istos-test/{uuid.uuid4().hex[:12]}"
        self.configs = mesh_configs(1 + relays)
        self.worker_ledger = tmp / "ran.jsonl"
        self.engine: Any = None
        self.next_i = 0
        self.owner = self.proc("owner", 0, f"sqlite+aiosqlite:///{tmp / 'owner.db'}",
                               self.worker_ledger)
        self.relays = [self.proc("relay", 1 + k, url, tmp / f"sent{k}.txt")
                       for k in range(relays)]

    def proc(self, role: str, k: int, url: str, ledger: Path) -> Proc:
        p = Proc(role, self.configs[k], self.prefix, url, self.table, node=NODE)
        p.args.append(str(ledger))
        return p

    async def open(self) -> None:
        from sqlalchemy.ext.asyncio import create_async_engine

        self.engine = create_async_engine(self.url)
        await outbox.create_table(self.engine, self.table)

    async def close(self) -> None:
        for p in [self.owner, *self.relays]:
            p.kill()
        await outbox.drop_table(self.engine, self.table)
        await self.engine.dispose()

    async def commit(self, rows: int, *, rollback: int = 0) -> None:
        """``rows`` committed jobs in one transaction, and ``rollback`` rolled-back ones."""
        from sqlalchemy.ext.asyncio import AsyncSession

        async with AsyncSession(self.engine) as session:
            if rollback:
                async with session.begin():
                    for _ in range(rollback):
                        await outbox.enqueue(session, Q, {"i": -1}, table=self.table)
                    await session.rollback()
            async with session.begin():
                for _ in range(rows):
                    await outbox.enqueue(session, Q, {"i": self.next_i}, table=self.table)
                    self.next_i += 1

    def ran(self) -> Counter[int]:
        out: Counter[int] = Counter()
        if self.worker_ledger.exists():
            for line in self.worker_ledger.read_text().splitlines():
                try:
                    out[json.loads(line)["i"]] += 1
                except ValueError:
                    pass  # a torn line: the worker never dies in these tests
        return out

    async def depth(self) -> int:
        from sqlalchemy import func, select

        t = outbox.outbox_table(self.table)
        async with self.engine.connect() as conn:
            return int((await conn.execute(select(func.count()).select_from(t))).scalar_one())

    async def all_ran(self, bound_s: float = 60.0) -> Counter[int]:
        """Wait (bounded) until every committed row ran and the table is empty."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + bound_s
        while True:
            ran = self.ran()
            if len(ran) >= self.next_i and await self.depth() == 0:
                return ran
            if loop.time() > deadline:
                raise AssertionError(f"{len(ran)} of {self.next_i} rows ran; "
                                     f"{await self.depth()} rows left")
            await asyncio.sleep(0.05)  # the ledger is a file: nothing to await on


class ForkedRelay:
    """The relay of a :class:`Rig`, started by a fork server (``outbox_node.py relay-forks``):
    each ``start`` is a new relay OS process forked from one that already imported everything,
    so it serves within a fraction of a second instead of a Python start-up's seconds. ``kill``
    SIGKILLs it and waits until it is gone (its listening port free again). The same start,
    ready and kill as :class:`Proc`, and the same ledger (``sent0.txt``)."""

    def __init__(self, rig: Rig) -> None:
        args = rig.proc("relay-forks", 1, rig.url, rig.tmp / "sent0.txt").args
        self.server = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.DEVNULL, text=True)
        self.pid: int | None = None

    async def line(self, word: str, timeout_s: float = 30.0) -> str:
        """The server's next line, which must start with ``word`` (one command at a time)."""
        assert self.server.stdout is not None
        got = await asyncio.wait_for(asyncio.to_thread(self.server.stdout.readline), timeout_s)
        assert got.startswith(word), f"the relay fork server said {got!r}, not {word}"
        return got.strip()

    def send(self, command: str) -> None:
        assert self.server.stdin is not None
        self.server.stdin.write(command + "\n")
        self.server.stdin.flush()

    def start(self) -> None:
        self.send("start")

    async def ready(self) -> None:
        self.pid = int((await self.line("READY")).split()[1])

    async def kill(self) -> None:
        assert self.pid is not None
        os.kill(self.pid, signal.SIGKILL)
        self.send(f"reap {self.pid}")
        await self.line(f"REAPED {self.pid}")
        self.pid = None

    async def close(self) -> None:
        if self.pid is not None:
            await self.kill()
        self.server.kill()
        self.server.wait(10)


def check_once(rig: Rig, ran: Counter[int]) -> None:
    assert set(ran) == set(range(rig.next_i)), "a committed row never ran, or a foreign one did"
    twice = [i for i, n in ran.items() if n > 1]
    assert twice == [], f"rows run more than once: {twice[:10]}"


@pytest.fixture(params=["postgres", "sqlite"])
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return postgres_url()
    return f"sqlite+aiosqlite:///{tmp_path / 'app.db'}"


@pytest.fixture
async def rig(url: str, tmp_path: Path) -> AsyncIterator[Rig]:
    r = Rig(url, tmp_path)
    await r.open()
    try:
        yield r
    finally:
        await r.close()


@pytest.fixture
async def rig2(url: str, tmp_path: Path) -> AsyncIterator[Rig]:
    r = Rig(url, tmp_path, relays=2)
    await r.open()
    try:
        yield r
    finally:
        await r.close()


async def test_relay_killed_between_accept_and_delete(rig: Rig, tmp_path: Path) -> None:
    arm = tmp_path / "pause.arm"
    arm.touch()
    relay = rig.relays[0]
    os.environ["ISTOS_TEST_PAUSE_ARM"] = str(arm)
    try:
        rig.owner.start()
        relay.start()
        await rig.owner.ready()
        await relay.ready()
    finally:
        del os.environ["ISTOS_TEST_PAUSE_ARM"]
    await rig.commit(25, rollback=5)
    await relay.expect("PAUSED", 30)  # the owner accepted the rows; none is deleted yet
    assert await rig.depth() == 25
    relay.kill()
    relay.start()  # no pause this time; the killed relay's claim lapses after 1 s
    await relay.ready()
    check_once(rig, await rig.all_ran())
    sent = (tmp_path / "sent0.txt").read_text().split()
    assert len(sent) == 50 and len(set(sent)) == 25  # every row re-sent once: a no-op


@pytest.mark.timeout(300)
async def test_relay_sigkilled_at_random_moments(rig: Rig) -> None:
    """One owner for the whole test; 21 relay processes, forked from a server that imported
    everything once (:class:`ForkedRelay`), the first 20 SIGKILLed at a random moment after a
    commit of their own."""
    rng = random.Random(os.urandom(8))
    rig.owner.start()
    relay = ForkedRelay(rig)  # the server imports while the owner starts
    try:
        await relay.line("SERVING")
        await rig.owner.ready()
        for _ in range(20):
            relay.start()
            await relay.ready()
            await rig.commit(rng.randint(5, 40), rollback=rng.choice([0, 3]))
            await asyncio.sleep(rng.uniform(0, 0.3))  # the random moment of the kill
            await relay.kill()
        relay.start()
        await relay.ready()
        check_once(rig, await rig.all_ran())
    finally:
        await relay.close()


async def test_two_relays_on_one_table_send_each_row_once(rig2: Rig, tmp_path: Path) -> None:
    os.environ["ISTOS_CLAIM_S"] = "30"  # no claim lapses: a row sent twice is a claim bug
    try:
        rig2.owner.start()
        for r in rig2.relays:
            r.start()
        await rig2.owner.ready()
        for r in rig2.relays:
            await r.ready()
    finally:
        del os.environ["ISTOS_CLAIM_S"]
    ledgers = [tmp_path / f"sent{k}.txt" for k in range(2)]

    def sent() -> list[list[str]]:
        return [p.read_text().split() if p.exists() else [] for p in ledgers]

    # At least 600 rows in transactions of 10, and on until both relays sent some: which relay
    # wins a claim is the scheduler's choice, and on a loaded machine one relay can take every
    # row of a short run while the other waits for the CPU. Bounded: a relay that sends
    # nothing for a minute while rows keep coming is a failure.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60.0
    while rig2.next_i < 600 or not all(sent()):
        assert loop.time() < deadline, "one relay took every row: the claims never met"
        await rig2.commit(10)
    check_once(rig2, await rig2.all_ran())
    final = sent()
    assert len(final[0]) + len(final[1]) == rig2.next_i  # each row sent by one relay, once
    assert len(set(final[0]) | set(final[1])) == rig2.next_i


async def test_owner_down_10s_while_1000_rows_commit(rig: Rig) -> None:
    relay = rig.relays[0]
    rig.owner.start()
    relay.start()
    await rig.owner.ready()
    await relay.ready()
    await rig.commit(10)
    await rig.all_ran()
    rig.owner.kill()
    loop = asyncio.get_running_loop()
    down_until = loop.time() + 10.0
    for _ in range(100):  # 1,000 rows in 100 transactions, spread over the outage
        await rig.commit(10)
        await asyncio.sleep(max(0.0, (down_until - loop.time()) / 100))
    await asyncio.sleep(max(0.0, down_until - loop.time()))
    assert await rig.depth() == 1000  # nothing moved, nothing lost
    rig.owner.start()
    await rig.owner.ready()
    check_once(rig, await rig.all_ran(bound_s=90))
