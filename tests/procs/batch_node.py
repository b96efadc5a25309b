"""An owner OS process for the real-process batch and dependency tests
(``tests/test_batch_procs.py``, ``tests/test_deps_procs.py``).

argv: config_json prefix redis_url storage_ns ledger_key queue [queue...]
Serves each queue (a name starting with ``cb`` is served as an HA replica, ``ha=True``) with
Redis storage, and runs a worker for every queue that does not start with ``cb``: the worker
appends ``{"job", "attempt", "pid"}`` to the Redis list ``ledger_key`` (the test's independent
ledger) before returning, then the owner reports the member's end to the batch's home.
A member whose data is ``{"die": true}`` fails every attempt (it ends dead). A job whose data
names a ``gate`` first waits until the Redis list ``{ledger_key}:{gate}`` holds an element
(a blocking BRPOPLPUSH of the list onto itself, at most :data:`GATE_WAIT_S`; then the attempt
fails): the test opens the gate by pushing one, and the job is running (claimed, in its
handler) until then.
Prints READY once serving, then LEADING / STANDBY whenever its role for an HA queue changes.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from redis.asyncio import Redis

from istos import Istos, JobContext, RedisStoragePlugin

GATE_WAIT_S = 60  # how long a job waits at its shut gate before its attempt fails


async def main() -> None:
    config, prefix, url, ns, ledger_key = json.loads(sys.argv[1]), *sys.argv[2:6]
    queues = sys.argv[6:]
    ledger = Redis.from_url(url)
    app = Istos(RedisStoragePlugin(url, key_prefix=ns, connect_timeout_s=0.5,
                                   op_timeout_s=0.5),
                zenoh=config, prefix=prefix, node_id=f"owner-{os.getpid()}",
                request_timeout_s=1.0, shutdown_grace_s=0.5)
    for q in queues:
        ha = q.startswith("cb")
        app.queue(q, lease_s=2.0, sweep_interval_s=0.1, max_attempts=3, retry_backoff_s=0.05,
                  ha=ha, ha_lease_s=1.0)
        if ha:
            continue

        @app.worker(q, concurrency=4, poll_interval_s=0.1)
        async def member(job: dict, ctx: JobContext) -> None:
            gate = job.get("gate")
            if gate and await ledger.brpoplpush(f"{ledger_key}:{gate}", f"{ledger_key}:{gate}",
                                                timeout=GATE_WAIT_S) is None:
                raise RuntimeError(f"gate {gate!r} stayed shut")
            await asyncio.sleep(0.01)
            if job.get("die"):
                raise RuntimeError("this member always fails")
            await ledger.rpush(ledger_key, json.dumps(
                {"job": ctx.job_id, "attempt": ctx.attempt, "pid": os.getpid()}))

    async with app.serving():
        print("READY", flush=True)
        leading: bool | None = None
        ha_queue = next((q for q in queues if q.startswith("cb")), None)
        while True:
            if ha_queue is not None:
                now = app.is_active_owner(ha_queue)
                if now != leading:
                    leading = now
                    print("LEADING" if now else "STANDBY", flush=True)
            await asyncio.sleep(0.02)


if __name__ == "__main__":
    asyncio.run(main())
