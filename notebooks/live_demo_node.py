"""One process of the live demo in ``08-inspect-a-live-queue.ipynb``: an owner, a worker or a
producer of the queue ``jobs/demo``, on a private loopback Zenoh mesh.

    python live_demo_node.py owner    --prefix P --endpoint tcp/127.0.0.1:7450
    python live_demo_node.py worker   --prefix P --endpoint tcp/127.0.0.1:7450 --name worker-a
    python live_demo_node.py producer --prefix P --endpoint tcp/127.0.0.1:7450 --jobs 40

The owner listens on ``--endpoint`` and everyone else connects to it, with multicast scouting
off, so no other Zenoh peer on the host joins the demo; ``--prefix`` keeps its keys apart too.
Each process prints ``ready`` once it serves. The producer enqueues its jobs, prints
``produced <job ids>`` as JSON and exits; the owner and workers serve until SIGTERM or SIGINT,
until the process that started them goes away, or after ``--lifetime-s``, whichever comes first,
so an interrupted notebook cannot leave them running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal

from istos import Istos, JobContext

QUEUE = "jobs/demo"


def zenoh_config(endpoint: str, *, listen: bool) -> dict:
    config = {"mode": "peer",
              "scouting": {"multicast": {"enabled": False}, "gossip": {"enabled": False},
                           "delay": 20}}
    config["listen" if listen else "connect"] = {"endpoints": [endpoint]}
    return config


async def render(job: dict, ctx: JobContext) -> dict:
    """The demo's worker: takes ``work_s`` seconds; a ``poison`` job fails every time."""
    await asyncio.sleep(job["work_s"])
    if job.get("poison"):
        raise ValueError(f"page {job['page']}: the input file is corrupt")
    return {"page": job["page"], "attempt": ctx.attempt}


async def produce(app: Istos, jobs: int, seed: int) -> list[str]:
    """A burst of ``jobs`` pages (every tenth one poison, a few urgent), then two delayed ones."""
    rng = random.Random(seed)
    ids = []
    for page in range(jobs):
        data = {"page": page, "work_s": round(rng.uniform(0.1, 0.6), 2)}
        if page % 10 == 7:
            data["poison"] = True
        ids.append(await app.enqueue(QUEUE, data, priority=5 if page % 12 == 0 else 0))
    for page in (jobs, jobs + 1):
        ids.append(await app.enqueue(QUEUE, {"page": page, "work_s": 0.2}, delay_s=300))
    return ids


async def serve_until_told(lifetime_s: float) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    parent = os.getppid()
    give_up = loop.time() + lifetime_s
    while not stop.is_set() and loop.time() < give_up and os.getppid() == parent:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=("owner", "worker", "producer"))
    parser.add_argument("--prefix", required=True, help="Zenoh key prefix shared by the demo")
    parser.add_argument("--endpoint", required=True, help="the owner's tcp/127.0.0.1:PORT")
    parser.add_argument("--name", help="node id (default: the role)")
    parser.add_argument("--lease-s", type=float, default=3.0)
    parser.add_argument("--jobs", type=int, default=40, help="producer: how many jobs")
    parser.add_argument("--seed", type=int, default=8, help="producer: work times and order")
    parser.add_argument("--lifetime-s", type=float, default=300.0)
    args = parser.parse_args()

    app = Istos(zenoh=zenoh_config(args.endpoint, listen=args.role == "owner"),
                prefix=args.prefix, node_id=args.name or args.role, shutdown_grace_s=2.0)
    if args.role == "owner":
        app.queue(QUEUE, lease_s=args.lease_s, max_attempts=3, retry_backoff_s=0.5,
                  retry_backoff_max_s=2.0, keep_results=True, admin=True)
    elif args.role == "worker":
        app.worker(QUEUE, concurrency=2, poll_interval_s=0.5)(render)
    async with app.serving():
        print("ready", flush=True)
        if args.role == "producer":
            print("produced", json.dumps(await produce(app, args.jobs, args.seed)), flush=True)
        else:
            await serve_until_told(args.lifetime_s)


if __name__ == "__main__":
    asyncio.run(main())
