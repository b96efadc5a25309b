"""The engine's log records about a job carry ``queue``, ``job_id``, ``attempt`` and
``worker`` as attributes (``extra=``), and a failing attempt logs exactly once, at the level
docs/logging.md states: over real Zenoh on a private loopback mesh, an owner app and a worker
app, with pytest's ``caplog`` catching what the ``istos`` loggers emit."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from helpers import count, wait_events
from zenoh_util import isolated_configs, unique_prefix

from istos import Istos
from istos.logfields import JOB_FIELDS

WAIT_S = 60.0  # generous: the machine is shared


def job_records(caplog: pytest.LogCaptureFixture, job_id: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records
            if r.name.startswith("istos") and getattr(r, "job_id", None) == job_id]


def apps() -> tuple[Istos, Istos]:
    configs, prefix = isolated_configs(2), unique_prefix()
    return (Istos(zenoh=configs[0], prefix=prefix, node_id="owner"),
            Istos(zenoh=configs[1], prefix=prefix, node_id="wk"))


async def test_a_failing_attempt_logs_once_with_the_jobs_fields_over_zenoh(caplog):
    caplog.set_level(logging.DEBUG, logger="istos")
    owner, worker = apps()
    owner.queue("q", max_attempts=2, retry_backoff_s=0.01, retry_backoff_max_s=0.01)

    @worker.worker("q")
    async def work(job: dict[str, Any]) -> str:
        if job["fail"]:
            raise RuntimeError(f"boom {job['n']}")
        return "ok"

    async with owner.serving(), worker.serving():
        good = await owner.enqueue("q", {"fail": False, "n": 0})
        bad = await owner.enqueue("q", {"fail": True, "n": 1})
        await wait_events(owner, lambda es: count(es, "dead_lettered", bad) == 1
                          and count(es, "acked", good) == 1, WAIT_S)

    failed = job_records(caplog, bad)
    by_worker = [r for r in failed if r.name == "istos.worker"]
    by_owner = [r for r in failed if r.name == "istos.owner"]
    # One record per attempt: a WARNING while attempts remain, an ERROR on the last one.
    assert [(r.levelno, r.attempt) for r in by_worker] == [  # type: ignore[attr-defined]
        (logging.WARNING, 1), (logging.ERROR, 2)]
    for r in by_worker:
        assert r.queue == "q" and r.worker.startswith("wk:work#")  # type: ignore[attr-defined]
        assert r.exc_info is not None and "boom 1" in r.getMessage()
    # The owner logs the dead letter once, naming the attempt and the worker that held it.
    assert len(by_owner) == 1 and by_owner[0].levelno == logging.WARNING
    dead = by_owner[0]
    assert (dead.queue, dead.attempt, dead.worker) == (  # type: ignore[attr-defined]
        "q", 2, by_worker[-1].worker)  # type: ignore[attr-defined]
    assert "dead-lettered" in dead.getMessage()
    # Nothing else at WARNING or above about it; a job that succeeded logs at DEBUG only.
    assert sum(r.levelno >= logging.WARNING for r in failed) == 3
    done = job_records(caplog, good)
    assert [r.levelno for r in done] == [logging.DEBUG]
    assert {k: getattr(done[0], k) for k in JOB_FIELDS}["attempt"] == 1


async def test_an_expired_lease_and_its_dead_letter_log_the_worker_over_zenoh(caplog):
    caplog.set_level(logging.INFO, logger="istos")
    owner, worker = apps()
    owner.queue("q", lease_s=0.5, max_attempts=1, sweep_interval_s=0.05)
    gate = asyncio.Event()

    @worker.worker("q")  # no heartbeat: the lease runs out while the function waits
    async def stall(job: dict[str, Any]) -> None:
        await asyncio.wait_for(gate.wait(), WAIT_S)

    async with owner.serving(), worker.serving():
        job_id = await owner.enqueue("q", {"n": 1})
        await wait_events(owner, lambda es: count(es, "dead_lettered", job_id) == 1, WAIT_S)
        gate.set()  # its late ack is refused as stale: the job stays dead

    records = [r for r in job_records(caplog, job_id) if r.name == "istos.owner"]
    assert len(records) == 2, [r.getMessage() for r in records]
    expired, dead = records
    assert "the lease of wk:stall#" in expired.getMessage() and "expired" in expired.getMessage()
    for r in records:
        assert r.levelno == logging.WARNING
        assert (r.queue, r.attempt) == ("q", 1)  # type: ignore[attr-defined]
        assert r.worker.startswith("wk:stall#")  # type: ignore[attr-defined]
    assert "dead-lettered after attempt 1" in dead.getMessage()

