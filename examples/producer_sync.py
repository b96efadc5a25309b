"""Put N jobs on "examples/squares" and wait for their results, from plain blocking code.

The same as ``producer.py`` for code with no event loop (a Flask or Django view, a script, a
thread): :class:`istos.SyncProducer` opens a Zenoh session of its own and each call blocks the
calling thread until the owner answers. Start ``examples/owner_worker.py`` first, then::

    python examples/producer_sync.py        # 10 jobs
    python examples/producer_sync.py 50     # 50 jobs
"""

from __future__ import annotations

import os
import sys
import time

from istos import SyncProducer

QUEUE = "examples/squares"


def wait_for_result(producer: SyncProducer, job_id: str, timeout_s: float = 60.0) -> int:
    """Ask the queue's owner about ``job_id`` until it is done; return what the worker returned."""
    deadline = time.monotonic() + timeout_s
    while True:
        reply = producer.result(QUEUE, job_id)  # {"state": ..., "result": ...}
        if reply["state"] == "done":
            return int(reply["result"])
        if reply["state"] in ("dead", "cancelled", "unknown"):
            raise RuntimeError(f"job {job_id} ended {reply['state']}: {reply.get('error')}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} still {reply['state']} after {timeout_s:g} s")
        time.sleep(0.05)


def main(n: int) -> None:
    # The context manager closes the producer's Zenoh session at the end of the block.
    with SyncProducer(zenoh=os.environ.get("ISTOS_ZENOH") or None,
                      prefix=os.environ.get("ISTOS_PREFIX", "istos")) as producer:
        # One request for the whole batch (or a few, if it is large); returns the ids in
        # order. Raises OwnerUnavailable if no owner of the queue answers within 5 s.
        job_ids = producer.enqueue_many(QUEUE, range(n))
        print(f"enqueued {len(job_ids)} jobs", flush=True)
        results = [wait_for_result(producer, j) for j in job_ids]
    for i, result in enumerate(results):
        print(f"{i} squared is {result}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10)
