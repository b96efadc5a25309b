"""An owner OS process driven by commands on stdin, for tests that attach to a live queue.

argv: config_json prefix queue
env: ISTOS_ADMIN=1 declares the queue with admin=True.
Prints READY once serving, then reads one command per line and answers with one line:
  ``enqueue N``  enqueue jobs {"i": 0..N-1} from this process      -> ``ENQUEUED N``
  ``report``     what this owner's own event log saw for the queue -> ``REPORT {json}``
                 (acked per job id, workers of claimed events, counts per kind, job ids)
  ``quit``       stop serving and exit                             -> ``BYE``
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter

from istos import Istos, JobEvent


async def main() -> None:
    config, prefix, queue = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    app = Istos(zenoh=config, prefix=prefix, node_id=f"owner-{os.getpid()}")
    app.queue(queue, admin=os.environ.get("ISTOS_ADMIN") == "1", sweep_interval_s=0.05)
    # The owner's own record of what happened, independent of anything sent over the mesh.
    kinds: Counter[str] = Counter()
    acked: Counter[str] = Counter()
    claimed_by: list[str] = []
    job_ids: list[str] = []

    def record(event: JobEvent) -> None:
        if event.queue != queue:
            return
        kinds[event.kind] += 1
        if event.kind == "acked":
            acked[event.job_id] += 1
        elif event.kind == "claimed":
            claimed_by.append(str(event.worker))

    app.events.subscribe(record)
    async with app.serving():
        print("READY", flush=True)
        while True:
            line = (await asyncio.to_thread(sys.stdin.readline)).split()
            if not line or line[0] == "quit":
                print("BYE", flush=True)
                return
            if line[0] == "enqueue":
                for i in range(int(line[1])):
                    job_ids.append(await app.enqueue(queue, {"i": i}))
                print(f"ENQUEUED {line[1]}", flush=True)
            elif line[0] == "report":
                report = {"acked": dict(acked), "claimed_by": sorted(set(claimed_by)),
                          "kinds": dict(kinds), "job_ids": job_ids}
                print("REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
