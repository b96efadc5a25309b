"""A pipeline whose owner process is SIGKILLed mid-stream: every id is confirmed by flush() (and
then runs, counted from the workers' fsynced ledger of side effects) or listed in NotAccepted;
none is silently lost.

Owner and worker are OS processes (``procs/ledger_node.py``) on a private redis-server
(append-only, fsync always) that the test starts itself; the producer is this process.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from test_chaos import mesh_configs
from test_chaos_ledger import ledger_lines, node, redis_store  # noqa: F401 - a fixture

from istos import Istos, NotAccepted, OwnerUnavailable, SyncProducer

pytestmark = pytest.mark.slow


async def run_pipeline(app: Istos, ids: range, kill_at: int,
                       kill: Callable[[], None]) -> tuple[
        list[str], NotAccepted | None]:
    """Enqueue ``ids`` through one pipeline, a few jobs per loop turn, calling ``kill()`` once
    job ``kill_at`` is handed over; the confirmed ids and the flush's error (if any)."""
    async with app.pipeline("q", max_in_flight=4) as p:
        for i in ids:
            p.enqueue({"i": i}, job_id=f"job-{i}")
            if i == kill_at:
                kill()
            if i % 10 == 9:
                await asyncio.sleep(0.002)  # a producer with other work: many small requests
        try:
            return await p.flush(), None
        except NotAccepted as exc:
            return exc.accepted, exc


def partition(ids: range, confirmed: list[str], err: NotAccepted | None) -> set[int]:
    """Check that every id is confirmed xor reported; the confirmed ones' numbers."""
    want = {f"job-{i}" for i in ids}
    reported = set(err.job_ids) if err is not None else set()
    assert set(confirmed) | reported == want, "an id was neither confirmed nor reported"
    assert not set(confirmed) & reported
    return {int(j.split("-")[1]) for j in confirmed}


async def test_owner_sigkilled_mid_pipeline_loses_no_confirmed_job(redis_store, tmp_path: Path,  # noqa: F811
                                                                    monkeypatch):
    monkeypatch.setenv("ISTOS_LEASE_S", "1")
    configs, prefix = mesh_configs(3), f"pl-{uuid.uuid4().hex[:8]}"
    owner = node("owner", configs[0], prefix, redis_store)
    ledger = tmp_path / "ledger.jsonl"
    worker = node("worker", configs[1], prefix, redis_store, ledger)
    producer = Istos(zenoh=configs[2], prefix=prefix, node_id="producer", request_timeout_s=2.0)
    try:
        owner.start()
        worker.start()
        await asyncio.gather(owner.ready(), worker.ready())
        async with producer.serving():
            # 1. Killed and restarted at once while jobs stream: the requests in flight at the
            #    kill are answered by the new owner (same ids: idempotent) or reported.
            first = range(0, 1000)

            def kill_and_restart() -> None:
                owner.kill()
                owner.start()

            confirmed, err = await run_pipeline(producer, first, 400, kill_and_restart)
            done_first = partition(first, confirmed, err)
            await owner.ready()
            # 2. Killed for good mid-stream: what was handed over after it cannot be confirmed.
            second = range(1000, 1300)
            confirmed2, err2 = await run_pipeline(producer, second, 1150, owner.kill)
            done_second = partition(second, confirmed2, err2)
            assert err2 is not None, "jobs sent to a dead owner were confirmed"
            assert {f"job-{i}" for i in range(1151, 1300)} <= set(err2.job_ids)
            assert all(isinstance(err2.causes[f"job-{i}"], OwnerUnavailable)
                       for i in range(1151, 1300))
            assert set(err2.unanswered) >= {f"job-{i}" for i in range(1151, 1300)}
            # Every confirmed job runs once an owner is back (the ledger is the workers').
            owner.start()
            await owner.ready()
            must_run = done_first | done_second
            await wait_done_set([ledger], must_run, 90)
            ran = set(ledger_lines([ledger]))
            assert must_run <= ran, f"confirmed yet never ran: {sorted(must_run - ran)[:20]}"
            # The reported ones are made sure of by sending them again with the same ids.
            reported = (set(err.job_ids) if err else set()) | set(err2.job_ids)
            async with producer.pipeline("q") as p:
                for jid in sorted(reported):
                    p.enqueue({"i": int(jid.split("-")[1])}, job_id=jid)
            await wait_done_set([ledger], set(range(1300)), 90)
            assert set(ledger_lines([ledger])) >= set(range(1300))
            print(f"\nphase 1: {len(done_first)} confirmed, "
                  f"{len(err.job_ids) if err else 0} reported; phase 2: {len(done_second)} "
                  f"confirmed, {len(err2.job_ids)} reported ({len(err2.unanswered)} unanswered)")
    finally:
        for p in (owner, worker):
            p.kill()


async def wait_done_set(ledgers: list[Path], want: set[int], timeout_s: float) -> None:
    """Until the ledgers hold every number of ``want`` (bounded; the asserts say what is
    missing)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not want <= set(ledger_lines(ledgers)):
        if asyncio.get_running_loop().time() > deadline:
            return
        await asyncio.sleep(0.1)  # workers report through a file: poll with a bound


async def test_owner_sigkilled_mid_sync_pipeline(redis_store, tmp_path: Path,  # noqa: F811
                                                 monkeypatch):
    """The same for SyncProducer.pipeline, from a thread without a loop: the owner is killed
    for good at job 300 of 600, then started again once flush() has reported."""
    monkeypatch.setenv("ISTOS_LEASE_S", "1")
    configs, prefix = mesh_configs(3), f"spl-{uuid.uuid4().hex[:8]}"
    owner = node("owner", configs[0], prefix, redis_store)
    ledger = tmp_path / "ledger.jsonl"
    worker = node("worker", configs[1], prefix, redis_store, ledger)
    ids = range(600)

    def produce(sp: SyncProducer) -> tuple[list[str], NotAccepted | None]:
        with sp.pipeline("q") as p:
            for i in ids:
                p.enqueue({"i": i}, job_id=f"job-{i}")
                if i == 300:
                    owner.kill()
            try:
                return p.flush(), None
            except NotAccepted as exc:
                return exc.accepted, exc

    try:
        owner.start()
        worker.start()
        await asyncio.gather(owner.ready(), worker.ready())
        with SyncProducer(configs[2], prefix=prefix, request_timeout_s=2.0) as sp:
            confirmed, err = await asyncio.to_thread(produce, sp)
            done = partition(ids, confirmed, err)
            assert err is not None and set(err.job_ids) >= {f"job-{i}" for i in range(301, 600)}
            owner.start()
            await owner.ready()
            await wait_done_set([ledger], done, 90)
            ran = set(ledger_lines([ledger]))
            assert done <= ran, f"confirmed yet never ran: {sorted(done - ran)[:20]}"

            def resend() -> list[str]:
                with sp.pipeline("q") as p:
                    for jid in err.job_ids:
                        p.enqueue({"i": int(jid.split("-")[1])}, job_id=jid)
                    return p.flush()

            assert sorted(await asyncio.to_thread(resend)) == sorted(err.job_ids)
            await wait_done_set([ledger], set(ids), 90)
            assert set(ledger_lines([ledger])) >= set(ids)
    finally:
        for p in (owner, worker):
            p.kill()
