"""A heart-beating worker OS process for tests/test_heartbeat.py.

argv: config_json prefix queue
Works ``queue`` with ``heartbeat=True``: each job prints ``STARTED <job_id>`` and then runs
until the process is killed (the test SIGKILLs it mid-job). Prints READY once serving.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from istos import Istos, JobContext


async def main() -> None:
    config, prefix, queue = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    app = Istos(zenoh=config, prefix=prefix, node_id=f"hb-{os.getpid()}")

    @app.worker(queue, heartbeat=True, poll_interval_s=0.2)
    async def work(job: dict, ctx: JobContext) -> None:
        print(f"STARTED {ctx.job_id}", flush=True)
        await asyncio.Event().wait()

    async with app.serving():
        print("READY", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
