"""Read ops over a deep queue share the owner's loop: each hands the loop over while it walks
the records, so claims and acks keep flowing. Measured as behaviour, not time: a clock whose
monotonic reading moves 0.5 ms at every look makes each slice end after a known amount of work,
and a task beside the read counts the turns the loop gave it while the read ran (a read that
never yields gives it none); ``why`` walks once, to make an index it reads from then on. The
p99 figures are in ``bench/read_ops.py``. Group rotation: a
claim looks at a bounded number of groups however many wait at their cap, and a group whose
lease ends takes the next turn."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest

from istos import Istos
from istos.clock import SystemClock
from istos.core import groups as groups_mod
from istos.core.records import QueuePolicy
from istos.core.state import QueueState

N_JOBS = 20_000


class TickingClock(SystemClock):
    """The system clock, except that monotonic time moves 0.5 ms at every reading."""

    def __init__(self) -> None:
        self.t = 0.0

    def monotonic(self) -> float:
        self.t += 0.0005
        return self.t


async def turns_while(call: Any) -> tuple[Any, int]:
    """Run ``call`` as a task; count the turns another task got before it finished."""
    reader = asyncio.ensure_future(call)
    turns = 0
    await asyncio.sleep(0)  # the reader's first step
    while not reader.done():
        turns += 1
        await asyncio.sleep(0)
    return reader.result(), turns


READS: list[tuple[str, dict[str, Any]]] = [
    ("jobs", {"state": "ready", "offset": N_JOBS - 10, "limit": 5}),
    ("leases", {"offset": 100_000}),
    ("why", {"job_id": f"j{N_JOBS - 1}"}),  # the first: it makes the index of ready jobs
    ("resolve", {"prefix": "zzzzzzzz"}),
    ("events", {"limit": 5000}),
    ("events_since", {"after": 0, "limit": 5000}),
]


@pytest.mark.slow
@pytest.mark.parametrize(("op", "fields"), READS, ids=[f"{op}-{i}" for i, (op, _) in
                                                        enumerate(READS)])
async def test_a_read_of_a_deep_queue_hands_the_loop_over_while_it_walks(op: str,
                                                                        fields: dict[str, Any]):
    app = Istos(clock=TickingClock(), node_id="owner")
    app.queue("q")
    async with app.serving():
        for start in range(0, N_JOBS, 4000):
            await app.enqueue_many("q", [{"i": i} for i in range(start, start + 4000)],
                                   job_ids=[f"j{i}" for i in range(start, start + 4000)])
        client = app.client("q")
        reply, turns = await turns_while(client.call(op, **fields))
        assert reply["ok"] is True
        assert turns >= 2, f"{op} held the loop for its whole walk"
    if op == "why":
        assert reply["why"]["ahead"] == N_JOBS - 1
    if op == "jobs":
        assert [j["job_id"] for j in reply["jobs"]] == [f"j{i}" for i in
                                                        range(N_JOBS - 10, N_JOBS - 5)]
    if op == "events":
        assert len(reply["events"]) == 5000


async def test_workers_reads_the_leases_not_every_waiting_job():
    """``workers`` finds what each worker holds from the lease heap when it is the shorter:
    three leases out of 20k waiting jobs take a handful of clock readings, not a walk."""
    clock = TickingClock()
    app = Istos(clock=clock, node_id="owner")
    app.queue("q")
    async with app.serving():
        for start in range(0, N_JOBS, 4000):
            await app.enqueue_many("q", [{"i": i} for i in range(start, start + 4000)],
                                   job_ids=[f"j{i}" for i in range(start, start + 4000)])
        client = app.client("q")
        for slot in range(3):
            claimed = await client.call("claim", workers=[f"w:c#{slot}"], node="w")
            assert len(claimed["jobs"]) == 1
        readings = clock.t
        reply = await client.call("workers")
        rows = {row["worker"]: row for row in reply["workers"]}
        assert sum(row["held_count"] for row in rows.values()) == 3, rows
        assert (clock.t - readings) / 0.0005 < 100, "workers walked the waiting jobs"


async def test_jobs_without_a_filter_skips_to_its_offset_without_a_walk():
    """Without a filter a page is a slice of the records' snapshot: a bounded number of Python
    calls (counted by a profile hook) whatever the offset, not one per record skipped."""
    app = Istos(node_id="owner")
    app.queue("q")
    async with app.serving():
        await app.enqueue_many("q", [{"i": i} for i in range(N_JOBS)],
                               job_ids=[f"j{i}" for i in range(N_JOBS)])
        client = app.client("q")
        calls = 0

        def profile(frame: Any, event: str, arg: Any) -> None:
            nonlocal calls
            calls += event == "call"

        sys.setprofile(profile)
        try:
            reply = await client.call("jobs", offset=N_JOBS - 10, limit=5)
        finally:
            sys.setprofile(None)
    assert [j["job_id"] for j in reply["jobs"]] == [f"j{i}" for i in
                                                    range(N_JOBS - 10, N_JOBS - 5)]
    assert calls < 500, calls


async def test_why_counts_the_jobs_ahead_from_the_index_without_a_walk():
    """``why`` of a ready job reads its rank in the queue's index of ready jobs, which the
    first ``why`` makes (walking the jobs in slices, as the READS above): after it, a bounded
    number of Python calls (counted by a profile hook), not one per job ahead; the count
    follows claims and a job of higher priority enqueued later."""
    app = Istos(node_id="owner")
    app.queue("q")
    async with app.serving():
        await app.enqueue_many("q", [{"i": i} for i in range(N_JOBS)],
                               job_ids=[f"j{i}" for i in range(N_JOBS)])
        client = app.client("q")
        first = await client.call("why", job_id=f"j{N_JOBS - 1}")
        assert first["why"]["ahead"] == N_JOBS - 1
        calls = 0

        def profile(frame: Any, event: str, arg: Any) -> None:
            nonlocal calls
            calls += event == "call"

        sys.setprofile(profile)
        try:
            last = await client.call("why", job_id=f"j{N_JOBS - 2}")
        finally:
            sys.setprofile(None)
        assert last["why"]["ahead"] == N_JOBS - 2
        assert calls < 500, calls
        assert (await client.call("why", job_id="j1000"))["why"]["ahead"] == 1000
        assert len((await client.call("claim", workers=["w:c#0", "w:c#1"], node="w"))["jobs"]) == 2
        await app.enqueue("q", {"urgent": True}, priority=5, job_id="urgent")
        assert (await client.call("why", job_id="j1000"))["why"]["ahead"] == 999
        assert (await client.call("why", job_id="urgent"))["why"]["ahead"] == 0


def test_a_claim_looks_at_a_bounded_number_of_groups_at_their_cap():
    state = QueueState("q", QueuePolicy(group_concurrency=1))
    n = 4 * groups_mod.MAX_SCAN
    for g in range(n):
        for k in range(2):
            state.enqueue(f"g{g}-{k}", b"x", 0.0, group=f"g{g}")
    leased = state.claim([f"w#{i}" for i in range(n)], 1.0)
    assert len(leased) == n  # one per group: every group now at its cap
    ring = state.heaps.groups.ring  # type: ignore[union-attr]
    before = list(ring)
    assert state.claim(["w#x"], 2.0) == []  # all at their cap
    moved = next(i for i, name in enumerate(before) if name == ring[0])
    assert moved == groups_mod.MAX_SCAN  # looked at MAX_SCAN groups, not all of them
    # The lease of a group deep in the rotation ends: its next job is the next claim's.
    deep = before[(moved + n // 2) % n]
    rec = next(r for r in leased if r.group == deep)
    assert rec.lease_token is not None
    assert state.ack(rec.job_id, rec.lease_token, 3.0) == "ok"
    (again,) = state.claim(["w#y"], 4.0)
    assert again.group == deep
