"""A node OS process that declares a schedule, for the one-tick-per-slot test.

argv: config_json prefix queue role ledger_path
role "owner": own the queue, work it, and declare the schedule.
role "beat":  work the queue and declare the same schedule (no queue of its own).
env: ISTOS_SKEW_S shifts this process's wall clock (a real clock, read through the Clock port);
     ISTOS_EVERY_S is the schedule's period (default 1);
     ISTOS_LOG_TICKS=1 logs the schedule's debug lines (a refused repeat of a slot) to stderr.
Every job a worker runs appends one JSON line {"job_id", "pid", "role"} to ledger_path.
Prints READY once serving, then serves until killed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys

from istos import Istos, JobContext
from istos.clock import SystemClock


class SkewedClock(SystemClock):
    """The system clock, read ``skew_s`` ahead (negative: behind), as a badly synced host."""

    def __init__(self, skew_s: float) -> None:
        self.skew_s = skew_s

    def now(self) -> float:
        return super().now() + self.skew_s


async def main() -> None:
    config, prefix, queue, role, ledger = json.loads(sys.argv[1]), *sys.argv[2:6]
    if os.environ.get("ISTOS_LOG_TICKS") == "1":
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("TICKLOG %(message)s"))
        logger = logging.getLogger("istos.schedule")
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    clock = SkewedClock(float(os.environ.get("ISTOS_SKEW_S", "0")))
    app = Istos(zenoh=config, prefix=prefix, node_id=f"{role}-{os.getpid()}", clock=clock)
    if role == "owner":
        app.queue(queue, sweep_interval_s=0.05)

    @app.worker(queue, concurrency=2, poll_interval_s=0.2)
    async def work(job: dict, ctx: JobContext) -> None:
        with open(ledger, "a") as fh:  # one short O_APPEND write per line
            fh.write(json.dumps({"job_id": ctx.job_id, "pid": os.getpid(), "role": role})
                     + "\n")

    app.schedule(queue, {"kind": "beat"}, every_s=float(os.environ.get("ISTOS_EVERY_S", "1")),
                 name="beat")
    async with app.serving():
        print("READY", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
