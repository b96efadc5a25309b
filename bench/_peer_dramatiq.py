"""Peer-bench driver: Dramatiq on Redis, a worker with 8 threads (see ``_peer_harness.py``).

The broker's namespace is unique per round; every key under it is deleted afterwards.
``actor.send`` is one Redis round trip (the broker's enqueue script), awaited by the caller.
"""

from __future__ import annotations

import json
import secrets
import sys
from typing import Any

import _peer_harness as h
import _peer_redis_util as ru
import dramatiq
from dramatiq.brokers.redis import RedisBroker

COUNTER: h.Counter | None = None


def setup(spec: dict[str, Any]) -> Any:
    broker = RedisBroker(url=ru.REDIS_URL, namespace=spec["tag"])
    dramatiq.set_broker(broker)

    @dramatiq.actor(queue_name="jobs", max_retries=0, actor_name="noop")
    def noop(body: dict[str, Any]) -> None:
        assert COUNTER is not None
        COUNTER.start(body)
        COUNTER.hit(body)

    return broker, noop


class Producer:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.broker, self.actor = setup(spec)

    def enqueue_all(self, jobs: list[dict[str, Any]], timed: bool) -> list[float]:
        perf, send, out = h.time.perf_counter, self.actor.send, []
        for job in jobs:
            t = perf()
            send(job)
            if timed:
                out.append(perf() - t)
        return out

    def enqueue_concurrent(self, jobs: list[dict[str, Any]], width: int) -> None:
        h.threaded_loop(self.actor.send, jobs, width)

    def close(self) -> None:
        self.broker.close()
        if not self.spec.get("attach"):
            ru.delete_tagged(self.spec["tag"])


def run_worker(spec: dict[str, Any], counter: h.Counter) -> None:
    global COUNTER
    COUNTER = counter
    broker, _ = setup(spec)
    worker = dramatiq.Worker(broker, worker_threads=int(spec["concurrency"]))
    worker.start()
    h.wait_for_stop_line()
    worker.stop()
    broker.close()


if __name__ == "__main__":
    if sys.argv[1] == "run":
        sys.argv[2] = json.dumps({**json.loads(sys.argv[2]),
                                  "tag": f"istos-bench-dq-{secrets.token_hex(6)}"})
    h.main(sys.argv, Producer, run_worker)
