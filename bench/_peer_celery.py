"""Peer-bench driver: Celery on RabbitMQ (127.0.0.1:5672, guest/guest), a thread pool of 8.

A queue and exchange named uniquely per round, deleted afterwards; no result backend; remote
control, mingle, gossip and heartbeats off (nothing else is declared on the broker). Note: by
default Celery's ``delay`` returns once the message is written to the socket -- it does not wait
for the broker to confirm it (``confirm_publish`` off), which is what users get by default.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
from typing import Any

import _peer_harness as h
from celery import Celery
from kombu import Exchange, Queue

BROKER = "amqp://guest:guest@127.0.0.1:5672//"
COUNTER: h.Counter | None = None


def setup(spec: dict[str, Any]) -> Any:
    tag = spec["tag"]
    app = Celery("istos_bench", broker=BROKER)
    app.conf.update(
        task_ignore_result=True, task_default_queue=tag, task_default_exchange=tag,
        task_default_routing_key=tag,
        task_queues=[Queue(tag, Exchange(tag, type="direct"), routing_key=tag)],
        worker_enable_remote_control=False, worker_send_task_events=False,
        worker_hijack_root_logger=False, worker_redirect_stdouts=False,
        broker_connection_retry_on_startup=True)

    @app.task(name="noop")
    def noop(body: dict[str, Any]) -> None:
        assert COUNTER is not None
        COUNTER.start(body)
        COUNTER.hit(body)

    return app, noop


class Producer:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.app, self.task = setup(spec)
        self.task.delay({"i": -1, "phase": "warmup"})  # connects; the worker skips it

    def enqueue_all(self, jobs: list[dict[str, Any]], timed: bool) -> list[float]:
        perf, delay, out = h.time.perf_counter, self.task.delay, []
        for job in jobs:
            t = perf()
            delay(job)
            if timed:
                out.append(perf() - t)
        return out

    def enqueue_concurrent(self, jobs: list[dict[str, Any]], width: int) -> None:
        h.threaded_loop(self.task.delay, jobs, width)

    def close(self) -> None:
        tag = self.spec["tag"]
        if self.spec.get("attach"):
            self.app.close()
            return
        with self.app.connection_for_write() as conn:
            channel = conn.default_channel
            channel.queue_delete(tag)
            channel.exchange_delete(tag)
        self.app.close()


def run_worker(spec: dict[str, Any], counter: h.Counter) -> None:
    global COUNTER
    COUNTER = counter
    app, _ = setup(spec)

    def stopper() -> None:  # all phases are counted before the producer asks us to stop
        h.wait_for_stop_line()
        os._exit(0)

    threading.Thread(target=stopper, daemon=True).start()
    app.Worker(pool="threads", concurrency=int(spec["concurrency"]), loglevel="WARNING",
               without_heartbeat=True, without_mingle=True, without_gossip=True,
               queues=[spec["tag"]], quiet=True).start()


if __name__ == "__main__":
    if sys.argv[1] == "run":
        sys.argv[2] = json.dumps({**json.loads(sys.argv[2]),
                                  "tag": f"istos-bench-cel-{secrets.token_hex(6)}"})
    h.main(sys.argv, Producer, run_worker)
