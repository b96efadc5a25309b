"""Peer-bench driver: arq on Redis (max_jobs 8, poll_delay 10 ms).

The queue is named uniquely per round and every job id carries that name, so all of arq's keys
for the round (``arq:job:<id>``, ``arq:in-progress:<id>``, the queue, its health check) contain
it and are deleted afterwards. ``enqueue_job`` (one transaction) is awaited by the producer.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
from typing import Any

import _peer_harness as h
import _peer_redis_util as ru
from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import Worker, func

COUNTER: h.Counter | None = None
SETTINGS = RedisSettings(host="127.0.0.1", port=6379)


async def noop(ctx: dict[str, Any], body: dict[str, Any]) -> None:
    assert COUNTER is not None
    COUNTER.start(body)
    COUNTER.hit(body)


class Producer:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.lt = h.LoopThread()
        self.pool = self.lt.run(create_pool(SETTINGS))

    async def one(self, job: dict[str, Any]) -> None:
        tag = self.spec["tag"]
        await self.pool.enqueue_job("noop", job, _job_id=f"{tag}-{job['phase']}-{job['i']}",
                                    _queue_name=tag)

    def enqueue_all(self, jobs: list[dict[str, Any]], timed: bool) -> list[float]:
        result: list[float] = self.lt.run(h.timed_loop(self.one, jobs, timed))
        return result

    def enqueue_concurrent(self, jobs: list[dict[str, Any]], width: int) -> None:
        self.lt.run(h.concurrent_loop(self.one, jobs, width))

    def close(self) -> None:
        try:
            self.lt.run(self.pool.aclose())
        finally:
            self.lt.close()
            if not self.spec.get("attach"):
                ru.delete_tagged(self.spec["tag"])


def run_worker(spec: dict[str, Any], counter: h.Counter) -> None:
    global COUNTER
    COUNTER = counter

    async def main() -> None:
        worker = Worker(functions=[func(noop, name="noop")], redis_settings=SETTINGS,
                        queue_name=spec["tag"], max_jobs=int(spec["concurrency"]),
                        poll_delay=0.01, keep_result=0, handle_signals=False)
        task = asyncio.create_task(worker.async_run())
        await asyncio.to_thread(h.wait_for_stop_line)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await worker.close()

    asyncio.run(main())


if __name__ == "__main__":
    if sys.argv[1] == "run":
        sys.argv[2] = json.dumps({**json.loads(sys.argv[2]),
                                  "tag": f"istos-bench-arq-{secrets.token_hex(6)}"})
    h.main(sys.argv, Producer, run_worker)
