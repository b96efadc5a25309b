"""A worker OS process for tests/test_replay_live.py.

argv: config_json prefix node_id concurrency queue [queue...]
Each job carries its behaviour per attempt: ``{"runs": [seconds...], "fails": [bool...]}``;
attempt k sleeps ``runs[k-1]`` (the last entry past the end), then raises if ``fails[k-1]``,
else prints ``DONE <job_id> <attempt>`` (a side effect the test counts); ``START`` and
``FAIL`` lines tell the test what it is running. Prints READY once
serving; the test SIGKILLs one such process mid-run.
"""

from __future__ import annotations

import asyncio
import json
import sys

from istos import Istos, JobContext


async def main() -> None:
    config, prefix, node_id = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    concurrency, queues = int(sys.argv[4]), sys.argv[5:]
    app = Istos(zenoh=config, prefix=prefix, node_id=node_id)

    async def work(job: dict, ctx: JobContext) -> None:
        k = min(ctx.attempt, len(job["runs"])) - 1
        print(f"START {ctx.job_id} {ctx.attempt}", flush=True)
        await asyncio.sleep(job["runs"][k])
        if job["fails"][k]:
            print(f"FAIL {ctx.job_id} {ctx.attempt}", flush=True)
            raise RuntimeError(f"planned failure of attempt {ctx.attempt}")
        print(f"DONE {ctx.job_id} {ctx.attempt}", flush=True)

    for queue in queues:
        app.worker(queue, concurrency=concurrency, prefetch=0, poll_interval_s=0.2)(work)
    async with app.serving():
        print("READY", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
