"""The engine over real Zenoh on loopback: several apps in one process and OS processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import count, wait_events
from zenoh_util import isolated_configs, unique_prefix

from istos import Istos, JobContext, OwnerUnavailable

PROC = str(Path(__file__).parent / "procs" / "zworker.py")


def spawn(config: dict, prefix: str, queue: str, mode: str, out: Path | None = None,
          **env: str) -> subprocess.Popen[str]:
    args = [sys.executable, PROC, json.dumps(config), prefix, queue, mode]
    if out is not None:
        args.append(str(out))
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env})
    return proc


async def wait_ready(proc: subprocess.Popen[str], timeout_s: float = 20.0) -> None:
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout_s)
    assert line.strip() == "READY", (line, proc.stderr.read() if proc.poll() else "")


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


async def test_single_delivery_across_three_apps_over_zenoh():
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    seen: dict[int, list[str]] = {}
    workers = []
    for i in (1, 2):
        app = Istos(zenoh=configs[i], prefix=prefix, node_id=f"w{i}")

        @app.worker("q", concurrency=4, poll_interval_s=0.2)
        async def handle(job, ctx: JobContext, _name=f"w{i}"):
            seen.setdefault(job["i"], []).append(ctx.worker)

        workers.append(app)
    async with owner.serving(), workers[0].serving(), workers[1].serving():
        for i in range(300):
            await owner.enqueue("q", {"i": i})
        await wait_events(owner, lambda ev: count(ev, "acked") == 300, timeout_s=30)
    assert sorted(seen) == list(range(300))
    assert all(len(v) == 1 for v in seen.values())
    assert {w.split(":")[0] for v in seen.values() for w in v} == {"w1", "w2"}


async def test_single_delivery_across_two_os_processes(tmp_path):
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    outs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    async with owner.serving():
        procs = [spawn(configs[1 + i], prefix, "q", "record", outs[i]) for i in range(2)]
        try:
            await asyncio.gather(*(wait_ready(p) for p in procs))
            for i in range(400):
                await owner.enqueue("q", {"i": i})
            await wait_events(owner, lambda ev: count(ev, "acked") == 400, timeout_s=60)
        finally:
            for p in procs:
                stop(p)
    rows = [json.loads(line) for out in outs if out.exists()
            for line in out.read_text().splitlines()]
    assert sorted(r["job"]["i"] for r in rows) == list(range(400))  # each exactly once
    assert len({r["pid"] for r in rows}) == 2  # both processes competed


async def test_crashed_worker_process_job_redelivered_after_lease_with_attempt_2(tmp_path):
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q", lease_s=1.0, sweep_interval_s=0.05)
    out = tmp_path / "rescued.jsonl"
    async with owner.serving():
        doomed = spawn(configs[1], prefix, "q", "die", ISTOS_CONCURRENCY="1")
        try:
            await wait_ready(doomed)
            jid = await owner.enqueue("q", {"n": 1})
            await asyncio.wait_for(asyncio.to_thread(doomed.wait), 20)
            assert doomed.returncode == 17  # it died holding the job
            rescuer = spawn(configs[2], prefix, "q", "record", out)
            try:
                await wait_ready(rescuer)
                events = await wait_events(owner, lambda ev: count(ev, "acked", jid) == 1,
                                           timeout_s=20)
            finally:
                stop(rescuer)
        finally:
            stop(doomed)
    assert count(events, "lease_expired", jid) == 1
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["attempt"] == 2 and row["job"] == {"n": 1}


async def test_owner_in_another_process_and_owner_unavailable_over_zenoh(tmp_path):
    configs, prefix = isolated_configs(2), unique_prefix()
    producer = Istos(zenoh=configs[0], prefix=prefix, node_id="producer",
                     request_timeout_s=1.0)
    async with producer.serving():
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(OwnerUnavailable):
            await producer.enqueue("q", {})
        assert loop.time() - start < 3.0
        owner = spawn(configs[1], prefix, "q", "owner")
        try:
            await wait_ready(owner)
            jid = await producer.enqueue("q", {"x": 1}, timeout_s=5.0)
            assert (await producer.result("q", jid))["state"] == "ready"
        finally:
            stop(owner)


async def test_default_config_two_apps_find_each_other():
    """Istos() with no zenoh config works on one machine out of the box (multicast scouting)."""
    prefix = unique_prefix()
    owner = Istos(prefix=prefix)
    owner.queue("q")
    other = Istos(prefix=prefix, request_timeout_s=10.0)
    async with owner.serving(), other.serving():
        jid = await other.enqueue("q", {"hello": "mesh"})
        assert (await other.result("q", jid))["state"] == "ready"
