"""Peer-bench driver: taskiq on Redis streams, one receiver with 8 async slots.

The stream and consumer group are named uniquely per round and deleted afterwards. The group
reads from the stream's start (``consumer_id="0"``), so the drain phase's jobs, added before the
worker exists, are delivered. ``task.kiq`` (one XADD) is awaited by the producer.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
from typing import Any

import _peer_harness as h
import _peer_redis_util as ru
from taskiq.api import run_receiver_task
from taskiq_redis import RedisStreamBroker

COUNTER: h.Counter | None = None


def setup(spec: dict[str, Any]) -> Any:
    broker = RedisStreamBroker(url=ru.REDIS_URL, queue_name=spec["tag"],
                               consumer_group_name=spec["tag"], consumer_id="0")

    @broker.task(task_name="noop")
    async def noop(body: dict[str, Any]) -> None:
        assert COUNTER is not None
        COUNTER.start(body)
        COUNTER.hit(body)

    return broker, noop


class Producer:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.lt = h.LoopThread()
        self.broker, self.task = setup(spec)
        self.lt.run(self.broker.startup())

    def enqueue_all(self, jobs: list[dict[str, Any]], timed: bool) -> list[float]:
        result: list[float] = self.lt.run(h.timed_loop(self.task.kiq, jobs, timed))
        return result

    def enqueue_concurrent(self, jobs: list[dict[str, Any]], width: int) -> None:
        self.lt.run(h.concurrent_loop(self.task.kiq, jobs, width))

    def close(self) -> None:
        try:
            self.lt.run(self.broker.shutdown())
        finally:
            self.lt.close()
            if not self.spec.get("attach"):
                ru.delete_tagged(self.spec["tag"])


def run_worker(spec: dict[str, Any], counter: h.Counter) -> None:
    global COUNTER
    COUNTER = counter

    async def main() -> None:
        broker, _ = setup(spec)
        await broker.startup()
        receiver = asyncio.create_task(run_receiver_task(
            broker, max_async_tasks=int(spec["concurrency"]), run_startup=False))
        await asyncio.to_thread(h.wait_for_stop_line)
        receiver.cancel()
        await asyncio.gather(receiver, return_exceptions=True)
        await broker.shutdown()

    asyncio.run(main())


if __name__ == "__main__":
    if sys.argv[1] == "run":
        sys.argv[2] = json.dumps({**json.loads(sys.argv[2]),
                                  "tag": f"istos-bench-tq-{secrets.token_hex(6)}"})
    h.main(sys.argv, Producer, run_worker)
