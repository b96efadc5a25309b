"""An owner, HA replica or worker OS process for the ledger chaos tests.

argv: role config_json prefix storage_url storage_ns [ledger_path]
role "owner" | "replica" (ha=True) | "worker". Workers append one JSON line per finished job
({"i", "attempt", "pid"}) to ledger_path and fsync it *before* acking, so the ledger holds
every side effect that happened, even if the process is SIGKILLed right after.
env: ISTOS_HA_LEASE_S (default 1.5), ISTOS_LEASE_S (job lease, default 2),
ISTOS_MAX_ATTEMPTS (default 50), ISTOS_JOB_S (a worker's run time, default 0.002),
ISTOS_CONCURRENCY (a worker's, default 8),
ISTOS_TEST_LEASE_PAUSE ("stop:PATH" or "cut:PATH", see pause_after_lease_update),
ISTOS_TEST_REPORT_FENCE (print "FENCED <wall time>" when a write is refused by the fence).
Owners print READY; replicas print LEADING / STANDBY on every change of their role.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

from istos import Istos, JobContext, RedisStoragePlugin, SQLAlchemyStoragePlugin


def storage(url: str, ns: str):
    if url.startswith("redis"):
        return RedisStoragePlugin(url, key_prefix=ns, connect_timeout_s=0.5, op_timeout_s=0.5)
    return SQLAlchemyStoragePlugin(url, table=ns, op_timeout_s=1.0)


def pause_after_lease_update(spec: str) -> None:
    """Once PATH.arm exists, pause right after this process's next UPDATE of a leader lease
    row, *before* anything else runs (inside its transaction if the statement opened one):
    print PAUSED, then ``stop``: SIGSTOP itself; ``cut``: block until PATH.cut exists (the test
    has cut the link to the database meanwhile), then carry on into the cut."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    mode, path = spec.split(":", 1)
    fired = False

    def after(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        nonlocal fired
        if fired or not statement.lstrip().upper().startswith("UPDATE"):
            return
        if "#leader" not in repr(parameters) or not os.path.exists(path + ".arm"):
            return
        fired = True
        print("PAUSED", flush=True)
        if mode == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        deadline = time.monotonic() + 30
        while not os.path.exists(path + ".cut") and time.monotonic() < deadline:
            time.sleep(0.01)  # the test process creates the file: nothing to wait on

    event.listen(Engine, "after_cursor_execute", after)


def report_fence_refusals() -> None:
    """Print FENCED and the wall time once the owner logs a write refused by the fence."""
    import logging
    import time as wall

    from istos.errors import FencedOut

    class Report(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            args = record.args if isinstance(record.args, tuple) else ()
            if any(isinstance(a, FencedOut) for a in args):
                print(f"FENCED {wall.time():.6f}", flush=True)

    logging.getLogger("istos.owner").addHandler(Report(logging.WARNING))


async def main() -> None:
    role, config, prefix, url, ns = sys.argv[1], json.loads(sys.argv[2]), *sys.argv[3:6]
    ledger = sys.argv[6] if len(sys.argv) > 6 else None
    if os.environ.get("RUST_LOG"):
        import zenoh

        zenoh.try_init_log_from_env()  # Zenoh's own log on stderr, for diagnosis
    if os.environ.get("ISTOS_TEST_REPORT_FENCE"):
        report_fence_refusals()
    if os.environ.get("ISTOS_TEST_LEASE_PAUSE"):
        pause_after_lease_update(os.environ["ISTOS_TEST_LEASE_PAUSE"])
    app = Istos(storage=storage(url, ns) if role != "worker" else None, zenoh=config,
                prefix=prefix, node_id=f"{role}-{os.getpid()}", request_timeout_s=2.0,
                shutdown_grace_s=1.0)
    if role in ("owner", "replica"):
        app.queue("q", lease_s=float(os.environ.get("ISTOS_LEASE_S", "2")),
                  sweep_interval_s=0.1,
                  max_attempts=int(os.environ.get("ISTOS_MAX_ATTEMPTS", "50")),
                  retry_backoff_s=0.05,
                  ha=role == "replica",
                  ha_lease_s=float(os.environ.get("ISTOS_HA_LEASE_S", "1.5")))
    else:
        assert ledger is not None
        fd = os.open(ledger, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

        @app.worker("q", concurrency=int(os.environ.get("ISTOS_CONCURRENCY", "8")),
                    poll_interval_s=0.2)
        async def work(job: dict, ctx: JobContext) -> None:
            await asyncio.sleep(float(os.environ.get("ISTOS_JOB_S", "0.002")))
            line = json.dumps({"i": job["i"], "attempt": ctx.attempt, "pid": os.getpid()})
            os.write(fd, (line + "\n").encode())
            os.fsync(fd)  # the side effect is durable before the ack leaves

    async with app.serving():
        print("READY", flush=True)
        leading = None
        while True:
            if role == "replica":
                now = app.is_active_owner("q")
                if now != leading:
                    leading = now
                    print("LEADING" if now else "STANDBY", flush=True)
            await asyncio.sleep(0.02)


if __name__ == "__main__":
    asyncio.run(main())
