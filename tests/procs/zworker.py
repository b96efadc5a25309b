"""A worker OS process for integration tests.

argv: config_json prefix queue mode [out_path]
mode "record": append each job's data + attempt to out_path (one JSON line), ack.
mode "die": os._exit(17) in the middle of the first job (no ack, no nack).
mode "owner": own the queue (lease from env ISTOS_LEASE_S) and serve forever; "a,b" owns both.
Prints READY once serving. Env: ISTOS_CONCURRENCY (4), ISTOS_POLL_S (the workers' poll
interval, 0.2: also how long their claims park at a remote owner), ISTOS_PEERS (0: start at
once; n: open the session first and start once n peers are linked, at most 30 s later).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from istos import Istos, JobContext
from istos.transport.zenoh import ZenohTransport


async def main() -> None:
    config, prefix, queue, mode = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    out_path = sys.argv[5] if len(sys.argv) > 5 else None
    node_id, peers = f"{mode}-{os.getpid()}", int(os.environ.get("ISTOS_PEERS", "0"))
    if peers:
        transport = ZenohTransport(config, node_id=node_id)
        await transport.start()
        deadline = asyncio.get_running_loop().time() + 30.0
        while len(transport.peer_ids()) < peers and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)  # a Zenoh link coming up has no event to wait on
        app = Istos(transport=transport, prefix=prefix, node_id=node_id)
    else:
        app = Istos(zenoh=config, prefix=prefix, node_id=node_id)
    if mode == "owner":
        for name in queue.split(","):
            app.queue(name, lease_s=float(os.environ.get("ISTOS_LEASE_S", "30")),
                      sweep_interval_s=0.05)
    else:
        @app.worker(queue, concurrency=int(os.environ.get("ISTOS_CONCURRENCY", "4")),
                    poll_interval_s=float(os.environ.get("ISTOS_POLL_S", "0.2")))
        async def work(job: dict, ctx: JobContext) -> None:
            if mode == "die":
                os._exit(17)  # a crash mid-job: nothing is acked or nacked
            assert out_path is not None
            with open(out_path, "a") as fh:
                fh.write(json.dumps({"job": job, "attempt": ctx.attempt,
                                     "pid": os.getpid()}) + "\n")

    async with app.serving():
        print("READY", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
