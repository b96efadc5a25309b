"""An owner OS process for tests/test_cli_truth.py's follow test (killed with SIGKILL there).

argv: config_json prefix
Serves queue ``q``. Prints READY, then answers one line per command on stdin:
  ``enqueue N`` -> enqueues N jobs, then ``OK``
  ``quit``      -> ``BYE``
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from istos import Istos


async def main() -> None:
    config, prefix = json.loads(sys.argv[1]), sys.argv[2]
    app = Istos(zenoh=config, prefix=prefix, node_id=f"follow-owner-{os.getpid()}")
    app.queue("q")
    async with app.serving():
        print("READY", flush=True)
        while True:
            line = (await asyncio.to_thread(sys.stdin.readline)).split()
            if line[:1] == ["enqueue"]:
                for i in range(int(line[1])):
                    await app.enqueue("q", {"i": i})
                print("OK", flush=True)
            else:
                print("BYE", flush=True)
                return


if __name__ == "__main__":
    asyncio.run(main())
