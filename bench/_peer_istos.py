"""Peer-bench driver for Istos (this repository's package; see ``_peer_harness.py``).

Variants (``spec["variant"]``):
- ``local``: the owner lives in the producer's process (in-memory storage);
- ``remote``: the owner lives in its own process (``_peer_istos.py owner SPEC``), the producer
  is a third process reaching it over Zenoh, as a web process would;
- ``redis``: as ``local``, with Redis storage under a unique key prefix (wiped afterwards).

``spec["uvloop"]``: every process of the round (owner, producer, worker, the procs phase's
producers) runs its asyncio loops on uvloop (``uvloop.install()`` first thing), for an A/B
against the same variant without it in the same interleaved run.

The worker is always its own process (one worker, ``concurrency`` slots). Every process is on a
private loopback Zenoh mesh (the tests' ``isolated_configs`` shape), under a unique prefix.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
from typing import Any

import _peer_harness as h

from istos import Istos, RedisStoragePlugin
from istos.storage.base import Storage

QUEUE = "bench/jobs"
PIPE_TURN = 256  # jobs the pipelined producer hands over per loop turn
REDIS = "redis://127.0.0.1:6379/0"


def storage_for(spec: dict[str, Any]) -> Storage | None:
    if spec["variant"] == "redis":
        return RedisStoragePlugin(REDIS, key_prefix=spec["redis_prefix"])  # type: ignore[return-value]
    return None


def node(spec: dict[str, Any], role: str) -> int:
    """The role's index in the mesh: processes start in index order (each connects to the
    earlier ones), so the owner's own process, when there is one, comes first."""
    roles = ["owner", "producer", "worker"] if spec["variant"] == "remote" \
        else ["producer", "worker"]
    return roles.index(role)


class IstosProducer:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.lt = h.LoopThread()
        self.owner_proc: h.Child | None = None
        remote = spec["variant"] == "remote"
        attach = bool(spec.get("attach"))  # a procs-phase producer: the owner is up already
        if remote and not attach:
            self.owner_proc = h.Child([sys.executable, "-u", __file__, "owner", json.dumps(spec)])
            self.owner_proc.wait_tag(h.READY_TAG, 60)
        where = 3 + int(spec["slot"]) if attach else node(spec, "producer")
        self.app = Istos(storage=storage_for(spec), zenoh=spec["zenoh"][where],
                         prefix=spec["prefix"])
        if not remote:
            self.app.queue(QUEUE)
        self.lt.run(self.app.start())
        if remote:  # the first call waits for the route to the owner; not part of the figures
            self.lt.run(self.app.client(QUEUE).call("ping"))

    def enqueue_all(self, jobs: list[dict[str, Any]], timed: bool) -> list[float]:
        async def one(job: dict[str, Any]) -> None:
            await self.app.enqueue(QUEUE, job)

        result: list[float] = self.lt.run(h.timed_loop(one, jobs, timed))
        return result

    def enqueue_pipelined(self, jobs: list[dict[str, Any]]) -> None:
        """Every job through one ``app.pipeline``, a turn's worth at a time (as a producer
        that does other work between jobs would); returns once all are confirmed."""
        async def run() -> None:
            async with self.app.pipeline(QUEUE) as p:
                for k, job in enumerate(jobs):
                    p.enqueue(job)
                    if k % PIPE_TURN == PIPE_TURN - 1:
                        await asyncio.sleep(0)

        self.lt.run(run())

    def enqueue_concurrent(self, jobs: list[dict[str, Any]], width: int) -> None:
        async def one(job: dict[str, Any]) -> None:
            await self.app.enqueue(QUEUE, job)

        self.lt.run(h.concurrent_loop(one, jobs, width))

    def close(self) -> None:
        try:
            self.lt.run(self.app.stop())
            if self.spec["variant"] == "redis" and not self.spec.get("attach"):
                store = RedisStoragePlugin(REDIS, key_prefix=self.spec["redis_prefix"])

                async def wipe() -> None:
                    await store.open()
                    await store.wipe()
                    await store.close()

                self.lt.run(wipe())
        finally:
            if self.owner_proc is not None:
                self.owner_proc.stop()
            self.lt.close()


def run_worker(spec: dict[str, Any], counter: h.Counter) -> None:
    async def main() -> None:
        app = Istos(zenoh=spec["zenoh"][node(spec, "worker")], prefix=spec["prefix"])

        @app.worker(QUEUE, concurrency=int(spec["concurrency"]))
        async def handle(body: Any) -> None:
            counter.start(body)
            counter.hit(body)

        async with app.serving():
            await asyncio.to_thread(h.wait_for_stop_line)

    asyncio.run(main())


def run_owner(spec: dict[str, Any]) -> None:
    async def main() -> None:
        app = Istos(zenoh=spec["zenoh"][node(spec, "owner")], prefix=spec["prefix"])
        app.queue(QUEUE)
        async with app.serving():
            print(h.READY_TAG, flush=True)
            await asyncio.to_thread(h.wait_for_stop_line)

    asyncio.run(main())


def prepare(spec: dict[str, Any]) -> dict[str, Any]:
    """Fill in what a round needs: meshes, prefixes (called by ``run`` before anything)."""
    from _common import zenoh_configs

    spec = dict(spec)
    spec.setdefault("zenoh", zenoh_configs(3 + int(spec.get("producers", 0))))
    if spec["variant"] != "remote":  # the owner is in the producer: many producers, or a
        spec["producers"] = spec["width"] = 0  # concurrent one, would each be their own owner
    spec.setdefault("prefix", f"istos-bench/{secrets.token_hex(6)}")
    spec.setdefault("redis_prefix", f"istos-bench-{secrets.token_hex(6)}")
    return spec


if __name__ == "__main__":
    if json.loads(sys.argv[2]).get("uvloop"):
        import uvloop

        uvloop.install()  # before any loop exists: every loop of this process is uvloop's
    if sys.argv[1] == "owner":
        run_owner(json.loads(sys.argv[2]))
    else:
        if sys.argv[1] == "run":
            sys.argv[2] = json.dumps(prepare(json.loads(sys.argv[2])))
        h.main(sys.argv, IstosProducer, run_worker)
