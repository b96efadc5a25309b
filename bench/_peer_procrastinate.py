"""Peer-bench driver: procrastinate on PostgreSQL (127.0.0.1:5432, database ``test``).

Each round creates a schema of its own, applies procrastinate's schema inside it (every
connection sets ``search_path`` to it) and drops it, cascading, afterwards. One worker with
concurrency 8 (LISTEN/NOTIFY wakes it); ``defer_async`` (one INSERT) is awaited by the producer.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
from typing import Any

import _peer_harness as h
import procrastinate
import psycopg

COUNTER: h.Counter | None = None
BASE = "host=127.0.0.1 port=5432 user=postgres dbname=test"


def setup(spec: dict[str, Any]) -> Any:
    conninfo = f"{BASE} options='-c search_path={spec['tag']}'"
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name="noop", queue="jobs")
    async def noop(body: dict[str, Any]) -> None:
        assert COUNTER is not None
        COUNTER.start(body)
        COUNTER.hit(body)

    return app, noop


class Producer:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        if not spec.get("attach"):
            with psycopg.connect(BASE, autocommit=True) as conn:
                conn.execute(f'CREATE SCHEMA "{spec["tag"]}"')
        self.lt = h.LoopThread()
        self.app, self.task = setup(spec)
        self.lt.run(self._open())

    async def _open(self) -> None:
        await self.app.open_async()
        if not self.spec.get("attach"):
            await self.app.schema_manager.apply_schema_async()

    async def one(self, job: dict[str, Any]) -> None:
        await self.task.defer_async(body=job)

    def enqueue_all(self, jobs: list[dict[str, Any]], timed: bool) -> list[float]:
        result: list[float] = self.lt.run(h.timed_loop(self.one, jobs, timed))
        return result

    def enqueue_concurrent(self, jobs: list[dict[str, Any]], width: int) -> None:
        self.lt.run(h.concurrent_loop(self.one, jobs, width))

    def close(self) -> None:
        try:
            self.lt.run(self.app.close_async())
        finally:
            self.lt.close()
            if not self.spec.get("attach"):
                with psycopg.connect(BASE, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{self.spec["tag"]}" CASCADE')


def run_worker(spec: dict[str, Any], counter: h.Counter) -> None:
    global COUNTER
    COUNTER = counter

    async def main() -> None:
        app, _ = setup(spec)
        async with app.open_async():
            task = asyncio.create_task(app.run_worker_async(
                queues=["jobs"], concurrency=int(spec["concurrency"]), wait=True,
                install_signal_handlers=False))
            await asyncio.to_thread(h.wait_for_stop_line)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


if __name__ == "__main__":
    if sys.argv[1] == "run":
        sys.argv[2] = json.dumps({**json.loads(sys.argv[2]),
                                  "tag": f"istos_bench_pc_{secrets.token_hex(6)}"})
    h.main(sys.argv, Producer, run_worker)
