"""Dependencies across real OS processes: two owner processes (``procs/batch_node.py``) on a
private loopback Zenoh mesh, durable storage on a private redis-server. P1 serves queue ``pa``
(parents), P2 serves ``pb`` (children, and some parents of theirs): each child waits for two
or three parents, some on both queues. P2 is SIGKILLed while the children wait (their first
parents end while it is down, so those reports are retried) and restarted; then P1 is
SIGKILLed while parents run (held in their handlers), and restarted: those parents run again
once their leases end. Every handler appends to a Redis list, an
independent ledger in one global order: every child ran exactly once, after each of its
parents' runs, none stranded, none lost."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from test_batch_procs import owner, private_rig, retry, until
from test_chaos import mesh_configs

from istos import Istos

FIRST, SECOND, ON_B, CHILDREN = 6, 6, 4, 12  # parents on pa (two waves), on pb; children


def parents_of(k: int) -> list[tuple[str, str]]:
    """Child ``k``'s parents: one of each wave on ``pa``, and, for every other child, one on
    ``pb`` (so a child has two or three parents, on one queue or both)."""
    refs = [("pa", f"a1-{k % FIRST}"), ("pa", f"a2-{(k + 1) % SECOND}")]
    if k % 2 == 0:
        refs.append(("pb", f"b-{k % ON_B}"))
    return refs


@pytest.mark.slow
async def test_dependencies_across_two_owner_processes_each_sigkilled_and_restarted(
        tmp_path: Path) -> None:
    rig = private_rig(tmp_path, "dp")
    store, url, ns, prefix, ledger_key = rig.store, rig.url, rig.ns, rig.prefix, rig.ledger_key
    configs = mesh_configs(3)
    p1 = owner(configs[0], prefix, url, ns, ledger_key, ["pa"])
    p2 = owner(configs[1], prefix, url, ns, ledger_key, ["pb"])
    ledger = Redis.from_url(url)
    app = Istos(zenoh=configs[2], prefix=prefix, node_id="producer", request_timeout_s=2.0)

    async def entries() -> list[dict[str, Any]]:
        return [json.loads(x) for x in await ledger.lrange(ledger_key, 0, -1)]

    async def ran(prefix: str, n: int) -> bool:
        return len({e["job"] for e in await entries() if e["job"].startswith(prefix)}) >= n

    async def leased(queue: str, jobs: set[str]) -> bool:
        reply = await retry("leases", lambda: app.client(queue).call("leases"))
        return jobs <= {x["job_id"] for x in reply["leases"]}

    async def open_gate(gate: str) -> None:
        await ledger.rpush(f"{ledger_key}:{gate}", "open")

    children = [f"child-{k}" for k in range(CHILDREN)]
    try:
        p1.start()
        p2.start()
        await p1.ready()
        await p2.ready()
        async with app.serving():
            # Every parent waits at its gate (running: claimed, in its handler) until opened.
            for i in range(FIRST):
                await retry("enqueue", lambda i=i: app.enqueue(
                    "pa", {"gate": "a1"}, job_id=f"a1-{i}"))
            for i in range(SECOND):  # half of them held until P1 was killed running them
                await retry("enqueue", lambda i=i: app.enqueue(
                    "pa", {"gate": "a2" if i < SECOND // 2 else "a3"}, job_id=f"a2-{i}"))
            for i in range(ON_B):
                await retry("enqueue", lambda i=i: app.enqueue(
                    "pb", {"gate": "b"}, job_id=f"b-{i}"))
            for k, child in enumerate(children):
                await retry("enqueue", lambda k=k, c=child: app.enqueue(
                    "pb", {"child": k}, job_id=c, after=parents_of(k)))
            waiting = {c: (await retry("result", lambda c=c: app.result("pb", c)))["state"]
                       for c in children}

            p2.kill()  # the children's owner dies while every child waits ...
            await open_gate("a1")  # ... and their first parents end meanwhile (reports retried)
            await until(lambda: ran("a1-", FIRST), 60, "the first wave of parents")
            p2.start()
            await p2.ready()
            await open_gate("b")
            await until(lambda: ran("b-", ON_B), 60, "the parents on pb")
            await open_gate("a2")
            await until(lambda: ran("a2-", SECOND // 2), 60, "half the second wave")
            held = {f"a2-{i}" for i in range(SECOND // 2, SECOND)}
            await until(lambda: leased("pa", held), 60, "the other half running")
            p1.kill()  # the parents' owner dies while those parents run (at their gate)
            p1.start()
            await p1.ready()
            await open_gate("a3")  # their runs were cut: redelivered once their leases end
            await until(lambda: ran("child-", CHILDREN), 90, "every child")
            states = {c: (await retry("result", lambda c=c: app.result("pb", c)))["state"]
                      for c in children}
        log = await entries()
    finally:
        p1.kill()
        p2.kill()
        await ledger.aclose()
        store.kill()
        store.wait(5)
    assert set(waiting.values()) == {"waiting"}  # every child waited when P2 was killed
    runs: dict[str, list[int]] = {}
    for i, e in enumerate(log):
        runs.setdefault(e["job"], []).append(i)
    parents = {j for k in range(CHILDREN) for _, j in parents_of(k)}
    assert parents <= set(runs)  # every parent ran (a run cut by SIGKILL may repeat)
    for k, child in enumerate(children):
        assert len(runs.get(child, [])) == 1, (child, runs.get(child))  # once: not lost
        last_parent_run = max(runs[j][-1] for _, j in parents_of(k))
        assert runs[child][0] > last_parent_run, (child, runs[child], last_parent_run)
    assert set(states.values()) <= {"done", "unknown"}  # none stranded (waiting or leased)
    repeated = {j: len(r) for j, r in runs.items() if len(r) > 1}
    assert not any(j.startswith("child-") for j in repeated)
    print(f"parents run more than once (cut by SIGKILL, at-least-once): {repeated}")
