"""A probe process for the partition benches: asks a queue's owner ``stats`` every 100 ms (1 s
timeout) and, with a rate, enqueues jobs at that many a second.

    python bench/_partition_probe.py CONFIG_JSON PREFIX QUEUE [ENQUEUES_PER_S]

Prints ``READY`` once serving, then one line per answer: ``S <sent> ok`` or ``S <sent>
<Error>`` for a probe, ``E <sent> ok <job i>`` or ``E <sent> <Error>`` for an enqueue; ``<sent>``
is ``time.monotonic()`` when the request left (one clock for every process on the machine,
namespaces included).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def ask(app: object, queue: str) -> None:
    sent = time.monotonic()
    try:
        await app.client(queue).call("stats", timeout_s=1.0)  # type: ignore[attr-defined]
        say(f"S {sent:.4f} ok")
    except Exception as exc:
        say(f"S {sent:.4f} {type(exc).__name__}")


async def feed(app: object, queue: str, rate: float) -> None:
    """Enqueue at ``rate`` a second, one at a time (a failed one is counted, not retried)."""
    i = 0
    while True:
        sent = time.monotonic()
        try:
            await app.enqueue(queue, {"i": f"{os.getpid()}-{i}"},  # type: ignore[attr-defined]
                              timeout_s=1.0)
            say(f"E {sent:.4f} ok {os.getpid()}-{i}")
        except Exception as exc:
            say(f"E {sent:.4f} {type(exc).__name__}")
        i += 1
        await asyncio.sleep(max(0.0, 1.0 / rate - (time.monotonic() - sent)))


async def main() -> None:
    from istos import Istos

    if os.environ.get("RUST_LOG"):
        import zenoh

        zenoh.try_init_log_from_env()  # Zenoh's own log on stderr, for diagnosis

    config, prefix, queue = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    rate = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    app = Istos(zenoh=config, prefix=prefix, node_id=f"probe-{os.getpid()}",
                request_timeout_s=1.0)
    async with app.serving():
        say("READY")
        tasks = [asyncio.create_task(feed(app, queue, rate))] if rate > 0 else []
        while True:
            tasks.append(asyncio.create_task(ask(app, queue)))
            tasks = [t for t in tasks if not t.done()]
            await asyncio.sleep(0.1)  # the probe's cadence


if __name__ == "__main__":
    asyncio.run(main())
