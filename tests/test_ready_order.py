"""The index of ready jobs (``istos/core/ready_order.py``) answers ``why``'s "ahead" in
O(log n): after any mix of enqueues (priorities, delays, groups), claims, acks, nacks,
cancels, edits, promotions, start deadlines, purges and rolled-back writes, it holds exactly
the ready jobs, and each one's rank is the count of ready jobs ordered before it."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from istos.core import leasing
from istos.core.edit import update_job
from istos.core.ready_order import LOAD, ReadyOrder
from istos.core.records import QueuePolicy
from istos.core.state import READY, JobRecord, QueueState
from istos.owner.views.inspect import count_ahead

pytestmark = pytest.mark.fast

OPS = ("enqueue", "enqueue", "enqueue", "claim", "ack", "nack", "cancel", "update", "promote",
       "wake", "expire", "purge", "rollback")


def check(state: QueueState) -> None:
    ready = [r for r in state.jobs.values() if r.state == READY]
    order = state.heaps.order
    assert len(order) == len(ready) == state.counts[READY]
    for rec in ready:
        assert order.ahead_of(rec.job_id) == count_ahead(state.jobs.values(), rec), rec.job_id


def leased(state: QueueState, rnd: random.Random) -> JobRecord | None:
    held = [r for r in state.jobs.values() if r.state == "leased"]
    return rnd.choice(held) if held else None


def pick(state: QueueState, rnd: random.Random, *states: str) -> str | None:
    ids = [j for j, r in state.jobs.items() if not states or r.state in states]
    return rnd.choice(ids) if ids else None


def settle(state: QueueState, rnd: random.Random, now: float, ack: bool) -> None:
    rec = leased(state, rnd)
    if rec is None or rec.lease_token is None:
        return
    if ack:
        state.ack(rec.job_id, rec.lease_token, now)
    else:
        state.nack(rec.job_id, rec.lease_token, now, "boom", rnd,
                   retry_after=rnd.choice([None, 0.0]))


def cancel(state: QueueState, rnd: random.Random, now: float) -> None:
    job_id = pick(state, rnd, "ready", "delayed", "leased")  # (the owner answers the rest)
    if job_id is not None:
        leasing.cancel(state, job_id, now)


def update(state: QueueState, rnd: random.Random, now: float) -> None:
    job_id = pick(state, rnd)
    if job_id is not None:
        update_job(state, job_id, now, priority=rnd.choice([None, 2, -2]),
                   ready_at=rnd.choice([None, now - 1.0, now + 1.0]))


def promote(state: QueueState, rnd: random.Random, now: float) -> None:
    job_id = pick(state, rnd)
    if job_id is not None:
        state.promote(job_id, now)


def enqueue(state: QueueState, rnd: random.Random, now: float, n: int) -> None:
    state.enqueue(f"j{n}", b"x", now, delay_s=rnd.choice([0.0, 0.0, 0.5, 2.0]),
                  priority=rnd.choice([0, 0, 1, -1]), group=rnd.choice([None, None, "a", "b"]),
                  start_by=rnd.choice([None, None, now + 1.0]))


STEPS: dict[str, Callable[[QueueState, random.Random, float, int], object]] = {
    "enqueue": enqueue,
    "claim": lambda s, r, now, n: s.claim([f"w#{i}" for i in range(r.randint(1, 3))], now),
    "ack": lambda s, r, now, n: settle(s, r, now, True),
    "nack": lambda s, r, now, n: settle(s, r, now, False),
    "cancel": lambda s, r, now, n: cancel(s, r, now),
    "update": lambda s, r, now, n: update(s, r, now),
    "promote": lambda s, r, now, n: promote(s, r, now),
    "wake": lambda s, r, now, n: s.wake_due(now),
    "expire": lambda s, r, now, n: s.expire_due(now),
    "purge": lambda s, r, now, n: s.purge_dead(now),
}


def step(state: QueueState, op: str, rnd: random.Random, now: float, n: int) -> None:
    if op == "rollback":  # a write that failed: its changes are put back
        state.track_undo()
        state.take_undo()
        for _ in range(rnd.randint(1, 4)):
            step(state, rnd.choice(OPS[:-1]), rnd, now, n + 100_000 + rnd.randint(0, 999))
        state.rollback(state.take_undo())
    else:
        STEPS[op](state, rnd, now, n)
    state.drain()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 120),
       made_at=st.integers(0, 60), seed_pieces=st.integers(1, 5))
def test_the_index_holds_exactly_the_ready_jobs_in_claim_order(seed: int, steps: int,
                                                               made_at: int, seed_pieces: int):
    """The index is made after ``made_at`` steps (as the first ``why`` makes it) and seeded
    from a snapshot in ``seed_pieces`` pieces with steps between them (the seeding yields to
    other requests); from then on it is exact."""
    rnd = random.Random(seed)
    state = QueueState("q", QueuePolicy(max_attempts=3, group_concurrency=1))
    now = 1000.0
    snapshot: list[tuple[int, float, int, str]] = []
    for n in range(steps):
        if n == made_at:
            state.heaps.order = ReadyOrder()
            snapshot = state.heaps.ready_entries()
        order = state.heaps.order
        if order is not None and not order.complete:
            piece, snapshot = snapshot[:max(1, len(snapshot) // seed_pieces)], \
                snapshot[max(1, len(snapshot) // seed_pieces):]
            order.seed(piece, state.jobs)
            order.complete = not snapshot
        now += rnd.choice([0.0, 0.1, 0.7])
        step(state, rnd.choice(OPS), rnd, now, n)
        if order is not None and order.complete:
            check(state)


def test_chunks_split_and_empty_as_jobs_come_and_go():
    """More keys than a few chunks hold, added out of order and removed from the middle and
    the ends: every rank stays the count of keys before it."""
    order, rnd = ReadyOrder(), random.Random(7)
    keys = {f"j{i}": (-rnd.randint(0, 2), rnd.random(), i, f"j{i}") for i in range(5 * LOAD)}
    for job_id, key in keys.items():
        order.add(job_id, key)
    for job_id in rnd.sample(sorted(keys), 3 * LOAD):
        order.discard(job_id)
        del keys[job_id]
    order.discard("never-added")
    ranked = sorted(keys.values())
    assert len(order) == len(ranked)
    for i, key in enumerate(ranked):
        assert order.ahead_of(key[3]) == i
    order.add(ranked[0][3], (9, 0.0, 10**9, ranked[0][3]))  # pushed again: now last
    assert order.ahead_of(ranked[0][3]) == len(ranked) - 1
    assert order.ahead_of("never-added") is None
