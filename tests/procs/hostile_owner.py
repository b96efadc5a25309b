"""The owner OS process of the hostile-input suite (tests/test_hostile.py).

argv: config_json prefix
Serves queues ``q`` (the known jobs), ``deadq`` (max_attempts=1) and ``idle`` (no jobs), none
with admin=True. Prints READY, then answers one line per command on stdin:
  ``rss``   -> ``RSS <kB>`` (VmRSS of this process)
  ``quit``  -> ``BYE``
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from istos import Istos


def rss_kb() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


async def main() -> None:
    config, prefix = json.loads(sys.argv[1]), sys.argv[2]
    app = Istos(zenoh=config, prefix=prefix, node_id=f"hostile-owner-{os.getpid()}")
    app.queue("q", lease_s=60.0, max_attempts=3, keep_results=True)
    app.queue("deadq", max_attempts=1)
    app.queue("idle")
    async with app.serving():
        print("READY", flush=True)
        while True:
            line = (await asyncio.to_thread(sys.stdin.readline)).strip()
            if line == "rss":
                print(f"RSS {rss_kb()}", flush=True)
            else:
                print("BYE", flush=True)
                return


if __name__ == "__main__":
    asyncio.run(main())
