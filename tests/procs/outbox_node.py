"""An owner+worker or an outbox relay OS process for the outbox crash tests.

argv: role config_json prefix url table ledger_path
role "owner": owns queue "jobs/email" on durable SQLite storage at ``url`` (its own file) and
works it; the worker appends one JSON line per finished job ({"i", "job_id", "pid"}) to
ledger_path and fsyncs it before acking. role "relay": relays outbox ``table`` at database
``url``; after the owner accepted a round's rows (before deleting them) it appends their job ids
to ledger_path, one per line, fsynced.
env: ISTOS_CLAIM_S (the relay's claim_s, default 1), ISTOS_TEST_PAUSE_ARM (relay: once this
file exists, print PAUSED after the next accepted round and hang before the delete, waiting
for SIGKILL). Both print READY when serving.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from istos import Istos, JobContext, SQLAlchemyStoragePlugin


def append(fd: int, line: str) -> None:
    os.write(fd, (line + "\n").encode())
    os.fsync(fd)  # durable before anything that follows


async def main() -> None:
    role, config, prefix, url, table, ledger = (sys.argv[1], json.loads(sys.argv[2]),
                                                *sys.argv[3:7])
    fd = os.open(ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    if role == "owner":
        app = Istos(storage=SQLAlchemyStoragePlugin(url, table="istos_kv"), zenoh=config,
                    prefix=prefix, node_id=f"owner-{os.getpid()}", shutdown_grace_s=1.0)
        app.queue("jobs/email", lease_s=5, sweep_interval_s=0.2, retry_backoff_s=0.05)

        @app.worker("jobs/email", concurrency=8, poll_interval_s=0.2)
        async def work(job: dict, ctx: JobContext) -> None:
            append(fd, json.dumps({"i": job["i"], "job_id": ctx.job_id, "pid": os.getpid()}))
    else:
        app = Istos(zenoh=config, prefix=prefix, node_id=f"relay-{os.getpid()}",
                    request_timeout_s=1.0)
        relay = app.outbox_relay(url, table=table, claim_s=float(os.environ.get(
            "ISTOS_CLAIM_S", "1")), poll_s=0.05, batch=200)
        arm = os.environ.get("ISTOS_TEST_PAUSE_ARM")

        async def after_send(job_ids: list[str]) -> None:
            for jid in job_ids:
                append(fd, jid)
            if arm and os.path.exists(arm):
                print("PAUSED", flush=True)
                await asyncio.Event().wait()  # hang before the delete, until SIGKILLed

        relay.after_send = after_send
    async with app.serving():
        print("READY", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
