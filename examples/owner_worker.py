"""The owner and a worker of the queue "examples/squares", in one process.

Run it in one terminal and leave it running::

    python examples/owner_worker.py

then start a producer in another (``python examples/producer.py``). Ctrl-C (or SIGTERM) stops
it cleanly: it stops claiming, lets the jobs it is running finish, and exits.

Both ends find each other with Zenoh's defaults (peers on one host discover each other). To
run them on a mesh of your own, give every process the same ``ISTOS_PREFIX`` (the key prefix
the queue lives under) and an ``ISTOS_ZENOH`` Zenoh config (inline JSON5 or a file path).
"""

from __future__ import annotations

import os

from istos import Istos, JobContext

QUEUE = "examples/squares"

app = Istos(
    zenoh=os.environ.get("ISTOS_ZENOH") or None,  # None: Zenoh's defaults (peer mode)
    prefix=os.environ.get("ISTOS_PREFIX", "istos"),  # producers must use the same prefix
)

# 1. Own the queue: this process holds its jobs (in memory: they are lost if it stops) and
#    leases each one to a worker for `lease_s` seconds. A job whose worker dies comes back
#    when its lease runs out, and a failed job is retried, up to `max_attempts` deliveries.
#    `keep_results=True` keeps what the worker returned, so producers can ask for it.
app.queue(QUEUE, lease_s=30, max_attempts=3, keep_results=True)


# 2. Work it: this function runs once per job, up to 4 at a time. It receives the job's body
#    (what the producer enqueued) and, in a parameter named `ctx`, the delivery's context.
#    Returning acks the job and its value becomes the result; raising nacks it (retried later).
@app.worker(QUEUE, concurrency=4)
async def square(n: int, ctx: JobContext) -> int:
    print(f"job {ctx.job_id}: {n} squared, attempt {ctx.attempt}", flush=True)
    return n * n


if __name__ == "__main__":
    print(f"serving {QUEUE!r}; Ctrl-C stops", flush=True)
    app.run()  # serve the queue and the worker until Ctrl-C or SIGTERM, then shut down
    print("stopped cleanly", flush=True)
