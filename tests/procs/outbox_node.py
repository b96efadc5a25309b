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

role "relay-forks" (same argv): a fork server of relays. It imports everything a relay needs
once, starts no thread and no loop, and reads commands from stdin: ``start`` forks a relay
process (a real OS process, killed by the test with SIGKILL, exactly like one started from
scratch) that prints ``READY <pid>`` when serving; ``reap <pid>`` waits until that process is
gone and prints ``REAPED <pid>``. A relay start then costs a fork and a Zenoh session instead
of a Python start-up and its imports, so a test can kill twenty of them in a few seconds.
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


async def main(announce: str = "READY") -> None:
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
        print(announce, flush=True)
        await asyncio.Event().wait()


def fork_server() -> None:
    """Fork a relay per ``start`` line on stdin; ``reap <pid>`` reports that one gone."""
    import aiosqlite  # noqa: F401 - imported once, before any fork: no thread until used
    import asyncpg  # noqa: F401
    import sqlalchemy.ext.asyncio  # noqa: F401
    import zenoh  # noqa: F401 - no session (and no Zenoh thread) until a child opens one

    import istos.outbox  # noqa: F401

    threads = os.listdir(f"/proc/{os.getpid()}/task")
    if len(threads) != 1:  # a child would inherit a lock some vanished thread held
        sys.exit(f"the fork server has {len(threads)} threads; it forks with one only")
    sys.argv[1] = "relay"
    print("SERVING", flush=True)
    for line in sys.stdin:
        command = line.split()
        if command == ["start"]:
            pid = os.fork()
            if pid == 0:  # the relay: never returns into this loop
                try:
                    asyncio.run(main(f"READY {os.getpid()}"))
                finally:
                    os._exit(1)
        elif command[:1] == ["reap"]:
            os.waitpid(int(command[1]), 0)
            print(f"REAPED {command[1]}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "relay-forks":
        fork_server()
    else:
        asyncio.run(main())
