"""An owner or worker OS process for the chaos and HA tests.

argv: role config_json prefix storage_url storage_ns [out_path]
role "owner" | "replica" (ha=True) | "worker". Workers append {"i": ..., "pid": ...} lines to
out_path after each job's side effect. Owners print READY; replicas print LEADING / STANDBY on
every change of their role.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from istos import Istos, RedisStoragePlugin, SQLAlchemyStoragePlugin


def storage(url: str, ns: str):
    if url.startswith("redis"):
        return RedisStoragePlugin(url, key_prefix=ns)
    return SQLAlchemyStoragePlugin(url, table=ns)


async def main() -> None:
    role, config, prefix, url, ns = sys.argv[1], json.loads(sys.argv[2]), *sys.argv[3:6]
    out_path = sys.argv[6] if len(sys.argv) > 6 else None
    app = Istos(storage=storage(url, ns) if role != "worker" else None, zenoh=config,
                prefix=prefix, node_id=f"{role}-{os.getpid()}", request_timeout_s=2.0)
    if role in ("owner", "replica"):
        app.queue("q", lease_s=2.0, sweep_interval_s=0.1, max_attempts=50,
                  retry_backoff_s=0.05, ha=role == "replica")
    else:
        fh = open(out_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the process

        @app.worker("q", concurrency=8, poll_interval_s=0.2)
        async def work(job: dict) -> None:
            await asyncio.sleep(0.001)
            fh.write(json.dumps({"i": job["i"], "pid": os.getpid()}) + "\n")

    async with app.serving():
        print("READY", flush=True)
        leading = None
        while True:
            if role == "replica":
                now = app.is_active_owner("q")
                if now != leading:
                    leading = now
                    print("LEADING" if now else "STANDBY", flush=True)
            await asyncio.sleep(0.05)


if __name__ == "__main__":
    asyncio.run(main())
