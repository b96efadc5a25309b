"""One tick per slot across real OS processes over Zenoh: two processes declare the same
schedule (every_s=1), one with its wall clock 0.3 s ahead; a worker ledger shows each slot ran
exactly once, and the nodes' logs show that the second tick of each slot was refused."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from zenoh_util import isolated_configs, unique_prefix, wait_until

PROC = str(Path(__file__).parent / "procs" / "beat_node.py")
SETTLED = 5  # slots both processes tick, after the second one is up


def spawn(config: dict, prefix: str, role: str, ledger: Path, **env: str) -> subprocess.Popen[str]:
    args = [sys.executable, PROC, json.dumps(config), prefix, "ticks", role, str(ledger)]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **env})


async def wait_ready(proc: subprocess.Popen[str], timeout_s: float = 20.0) -> None:
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout_s)
    assert line.strip() == "READY", (line, proc.stderr.read() if proc.poll() else "")


def stop(proc: subprocess.Popen[str]) -> str:
    """Kill ``proc`` (started by this test) and return what it wrote on stderr."""
    if proc.poll() is None:
        proc.kill()
    _, err = proc.communicate(timeout=10)
    return err


def slots(ledger: Path) -> list[int]:
    lines = [json.loads(line) for line in ledger.read_text().splitlines() if line.strip()]
    return [int(row["job_id"].rsplit(":", 1)[1]) for row in lines]


async def test_two_processes_declaring_one_schedule_tick_each_slot_once(tmp_path: Path) -> None:
    configs, prefix = isolated_configs(2), unique_prefix()
    ledger = tmp_path / "ledger.jsonl"
    ledger.touch()
    owner = spawn(configs[0], prefix, "owner", ledger, ISTOS_LOG_TICKS="1")
    beat = None
    try:
        await wait_ready(owner)
        beat = spawn(configs[1], prefix, "beat", ledger, ISTOS_SKEW_S="0.3", ISTOS_LOG_TICKS="1")
        await wait_ready(beat)
        # Both now tick every slot; leave one slot of margin for the mesh to connect.
        first = math.ceil(time.time()) + 1
        await wait_until(lambda: any(s >= first + SETTLED for s in slots(ledger)),
                         timeout_s=SETTLED + 15.0, what="the ledger reaches the last slot")
    finally:
        logs = stop(owner) + (stop(beat) if beat is not None else "")
    seen = slots(ledger)
    assert len(seen) == len(set(seen)), sorted(seen)  # no slot ran twice, anywhere
    assert set(range(first, first + SETTLED)) <= set(seen)  # and none was lost
    # Both nodes ticked each slot (the skewed one usually first); the owner refused the other.
    refused = [line for line in logs.splitlines()
               if line.startswith("TICKLOG") and "already enqueued" in line]
    assert len(refused) >= SETTLED, logs[-2000:]
