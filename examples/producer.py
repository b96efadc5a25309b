"""Put N jobs on "examples/squares" and wait for their results, from async code.

Start ``examples/owner_worker.py`` first, then::

    python examples/producer.py        # 10 jobs
    python examples/producer.py 50     # 50 jobs

It prints one line per result and exits with status 0 once every job is done (non-zero if a
job failed or no owner answered). ``ISTOS_PREFIX`` and ``ISTOS_ZENOH`` as for the owner.
"""

from __future__ import annotations

import asyncio
import os
import sys

from istos import Istos

QUEUE = "examples/squares"


async def wait_for_result(app: Istos, job_id: str, timeout_s: float = 60.0) -> int:
    """Ask the queue's owner about ``job_id`` until it is done; return what the worker returned.

    Polling is the simple way for a producer in another process; the owner answers from
    memory, so a question every 50 ms costs little.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        reply = await app.result(QUEUE, job_id)  # {"state": ..., "result": ...}
        if reply["state"] == "done":
            return int(reply["result"])
        if reply["state"] in ("dead", "cancelled", "unknown"):
            raise RuntimeError(f"job {job_id} ended {reply['state']}: {reply.get('error')}")
        if loop.time() > deadline:
            raise TimeoutError(f"job {job_id} still {reply['state']} after {timeout_s:g} s")
        await asyncio.sleep(0.05)


async def main(n: int) -> None:
    # A node that declares no queue and no worker: it only produces.
    app = Istos(zenoh=os.environ.get("ISTOS_ZENOH") or None,
                prefix=os.environ.get("ISTOS_PREFIX", "istos"))
    async with app.serving():  # opens the Zenoh session; closes it when the block ends
        # `enqueue` returns once the owner has stored the job, with the job's id. It raises
        # OwnerUnavailable if no owner of the queue answers within 5 s.
        job_ids = [await app.enqueue(QUEUE, i) for i in range(n)]
        print(f"enqueued {len(job_ids)} jobs", flush=True)
        results = await asyncio.gather(*(wait_for_result(app, j) for j in job_ids))
    for i, result in enumerate(results):
        print(f"{i} squared is {result}")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 10))
