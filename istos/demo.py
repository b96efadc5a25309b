"""The live half of `make demo`: an owner, a worker and a producer in one process on real Zenoh.

One concept at two layers: ``make demo``'s live half here, its simulated half in
``istos_nb/demo.py``.

One job succeeds; one fails every time, is retried with capped exponential backoff and ends in
the dead-letter list. The owner's events for both are printed as a table. The simulated half
(``python -m istos_nb.demo``) runs on the notebook side, which needs the ``notebook`` extra.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from . import Istos, JobContext
from .cancel_guard import within


def _table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def _note(kind: str, detail: dict) -> str:
    if kind == "retry_scheduled":
        return f"next try in {detail['delay_s']:.3f} s"
    if kind == "claimed":
        return f"lease {detail['lease_s']:g} s"
    return str(detail.get("error") or "")[:48]


async def main() -> None:
    # A private key prefix keeps this demo apart from any other Istos mesh on the host.
    app = Istos(prefix=f"istos-demo-{os.getpid()}")
    app.queue("jobs/email", lease_s=5, max_attempts=4, retry_backoff_s=0.2,
              retry_backoff_max_s=1.0, retry_jitter=0.1)
    finished = asyncio.Event()

    @app.worker("jobs/email", concurrency=2, poll_interval_s=0.5)
    async def send(job: dict, ctx: JobContext) -> None:
        if job["to"] == "bounce@example.invalid":
            if ctx.is_last_attempt:
                finished.set()
            raise ConnectionError(f"SMTP refused (attempt {ctx.attempt}/{ctx.max_attempts})")

    async with app.serving():
        print(f"node {app.node_id} serving 'jobs/email' over Zenoh\n")
        ok = await app.enqueue("jobs/email", {"to": "a@example.org", "body": "hi"})
        bad = await app.enqueue("jobs/email", {"to": "bounce@example.invalid", "body": "hi"})
        await within(finished.wait(), 30)
        while not await app.dead_letters("jobs/email"):
            await app.node.clock.sleep(0.01)
        events = [e for e in app.events.recent() if e.job_id in (ok, bad)]
        t0 = events[0].t
        rows = [(f"{e.t - t0:7.3f}", e.job_id[:8], e.kind, str(e.attempt), e.worker or "",
                 _note(e.kind, e.detail)) for e in events]
        print(_table(rows, ("t (s)", "job", "event", "try", "worker", "note")))
        (dead,) = await app.dead_letters("jobs/email")
        print(f"\ndead letter {dead['job_id'][:8]}: {dead['attempts']} attempts, "
              f"last error: {dead['last_error']}")
        waits = [h["backoff_s"] for h in dead["history"] if h["backoff_s"] is not None]
        print("backoff before each retry (s):", ", ".join(f"{w:.3f}" for w in waits))


if __name__ == "__main__":
    asyncio.run(main())
