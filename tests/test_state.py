"""Pure-core tests: QueueState driven with explicit times, no event loop."""

from __future__ import annotations

import random

import pytest

from istos.core.backoff import BackoffPolicy, backoff, delay_bounds, nominal_delay
from istos.core.state import (
    CANCELLED,
    DEAD,
    DELAYED,
    DONE,
    EXPIRED,
    LEASED,
    READY,
    WAITING,
    QueuePolicy,
    QueueState,
)

pytestmark = pytest.mark.fast  # `make check`: no process, server or session

RNG = random.Random(1)


def make(**kw) -> QueueState:
    policy = QueuePolicy(**{"lease_s": 10.0, "max_attempts": 3,
                            "backoff": BackoffPolicy(1.0, 8.0, 0.0), **kw})
    return QueueState("q", policy, node="n")


def claim_ids(state: QueueState, n: int, now: float) -> list[str]:
    return [r.job_id for r in state.claim([f"w#{i}" for i in range(n)], now)]


def test_priority_then_fifo():
    s = make()
    for i, prio in enumerate([0, 5, 0, 5, 1]):
        s.enqueue(f"j{i}", b"x", 0.0, priority=prio)
    assert claim_ids(s, 5, 1.0) == ["j1", "j3", "j4", "j0", "j2"]


def test_delay_holds_job_until_ready_at():
    s = make()
    s.enqueue("late", b"x", 0.0, delay_s=5.0)
    s.enqueue("now", b"x", 0.0)
    assert s.jobs["late"].state == DELAYED
    assert claim_ids(s, 2, 4.99) == ["now"]
    assert claim_ids(s, 2, 5.0) == ["late"]


def test_delayed_job_queues_behind_jobs_already_ready():
    s = make()
    s.enqueue("d", b"x", 0.0, delay_s=1.0)
    s.enqueue("a", b"x", 0.5)
    s.enqueue("b", b"x", 2.0)
    # "d" became ready at 1.0, after "a" (0.5) and before "b" (2.0)
    assert claim_ids(s, 3, 3.0) == ["a", "d", "b"]


def test_claim_leases_with_deadline_and_attempt():
    s = make()
    s.enqueue("j", b"x", 0.0)
    (rec,) = s.claim(["w#0"], 2.0)
    assert rec.state == LEASED and rec.attempts == 1 and rec.lease_deadline == 12.0
    assert rec.lease_worker == "w#0"
    assert s.claim(["w#1"], 3.0) == []  # one lease at a time


def test_lease_expiry_redelivers_with_next_attempt():
    s = make()
    s.enqueue("j", b"x", 0.0)
    (first,) = s.claim(["w#0"], 0.0)
    token1 = first.lease_token
    assert s.sweep(9.99) == 0
    assert s.sweep(10.0) == 1
    assert s.jobs["j"].state == READY and s.jobs["j"].last_error == "lease expired"
    (second,) = s.claim(["w#1"], 10.5)
    assert second.attempts == 2
    assert s.ack("j", token1, 11.0) == "stale"  # the first holder's late ack loses
    assert s.ack("j", second.lease_token, 11.0) == "ok"
    assert "j" not in s.jobs


def test_late_ack_after_expiry_but_before_reclaim_is_honoured():
    s = make()
    s.enqueue("j", b"x", 0.0)
    (rec,) = s.claim(["w#0"], 0.0)
    s.sweep(10.0)
    assert s.ack("j", rec.lease_token, 10.1) == "ok"
    assert s.claim(["w#1"], 10.2) == []


def test_nack_backs_off_exponentially_then_dead_letters():
    s = make()
    s.enqueue("j", b"x", 0.0)
    delays = []
    now = 0.0
    for attempt in (1, 2):
        (rec,) = s.claim(["w#0"], now)
        assert rec.attempts == attempt
        assert s.nack("j", rec.lease_token, now, "boom", RNG) == "ok"
        assert s.jobs["j"].state == DELAYED
        delays.append(s.jobs["j"].ready_at - now)
        assert s.claim(["w#0"], now + delays[-1] - 0.001) == []
        now += delays[-1]
    assert delays == [1.0, 2.0]
    (rec,) = s.claim(["w#0"], now)
    s.nack("j", rec.lease_token, now, "final boom", RNG)
    dead = s.jobs["j"]
    assert dead.state == DEAD and list(s.dead) == ["j"]
    assert dead.attempts == 3 and dead.last_error == "final boom"
    assert [a.outcome for a in dead.history] == ["nacked"] * 3
    assert [a.backoff_s for a in dead.history] == [1.0, 2.0, None]
    kinds = [e.kind for e in s.drain()[1]]
    assert kinds.count("retry_scheduled") == 2 and kinds[-1] == "dead_lettered"


def test_lease_expiry_counts_towards_max_attempts():
    s = make(max_attempts=2)
    s.enqueue("j", b"x", 0.0)
    s.claim(["w"], 0.0)
    s.sweep(10.0)
    s.claim(["w"], 10.0)
    s.sweep(20.0)
    assert s.jobs["j"].state == DEAD
    assert [a.outcome for a in s.jobs["j"].history] == ["lease_expired", "lease_expired"]


def test_results_kept_until_ttl():
    s = make(keep_results=True, result_ttl_s=100.0)
    s.enqueue("j", b"x", 0.0)
    (rec,) = s.claim(["w"], 0.0)
    s.ack("j", rec.lease_token, 1.0, b"\x01")
    assert s.jobs["j"].state == DONE and s.jobs["j"].result == b"\x01"
    s.sweep(100.9)
    assert "j" in s.jobs
    s.sweep(101.0)
    assert "j" not in s.jobs


def test_idempotent_enqueue():
    s = make()
    assert s.enqueue("j", b"a", 0.0) is True
    assert s.enqueue("j", b"b", 1.0) is False
    assert s.jobs["j"].body == b"a" and s.counts[READY] == 1


def test_restore_gives_leased_job_a_fresh_lease_on_this_clock():
    s = make()
    s.enqueue("j", b"x", 0.0)
    (rec,) = s.claim(["w"], 0.0)
    other = make()
    other.restore(rec, 1000.0)  # the new owner's clock reads much later
    assert other.jobs["j"].lease_deadline == 1010.0
    assert other.sweep(1009.0) == 0 and other.sweep(1010.0) == 1


def test_counts_track_states():
    s = make()
    for i in range(5):
        s.enqueue(f"j{i}", b"x", 0.0, delay_s=1.0 if i == 4 else 0.0)
    s.claim(["a", "b"], 0.0)
    assert s.counts == {READY: 2, DELAYED: 1, LEASED: 2, DONE: 0, DEAD: 0, CANCELLED: 0,
                        EXPIRED: 0, WAITING: 0}


def test_history_is_bounded_and_keeps_the_first_attempt():
    s = QueueState("q", QueuePolicy(lease_s=1, max_attempts=100, history_limit=4), node="n")
    s.enqueue("j", b"x", 0.0)
    now = 0.0
    for _ in range(10):
        s.promote_due(now)
        s.claim(["w"], now)
        now += 1.0
        s.sweep(now)
    hist = s.jobs["j"].history
    assert len(hist) == 4 and hist[0].attempt == 1 and hist[-1].attempt == 10


@pytest.mark.parametrize("attempt,expected", [(1, 1.0), (2, 2.0), (3, 4.0), (10, 8.0)])
def test_nominal_backoff_doubles_and_caps(attempt, expected):
    assert nominal_delay(attempt, BackoffPolicy(1.0, 8.0, 0.1)) == expected


def test_jittered_backoff_stays_in_band_and_under_cap():
    policy = BackoffPolicy(1.0, 8.0, 0.25)
    rng = random.Random(3)
    for attempt in range(1, 8):
        lo, hi = delay_bounds(attempt, policy)
        values = [backoff(attempt, policy, rng) for _ in range(200)]
        assert all(lo <= v <= hi <= 8.0 for v in values)
        assert max(values) - min(values) > 0  # jitter actually spreads retries


# -- write, then apply: undo snapshots and rollback ------------------------------------------


def fingerprint(s: QueueState) -> dict:
    return {"counts": dict(s.counts), "dead": list(s.dead),
            "jobs": {j: r.to_dict() for j, r in s.jobs.items()}}


def test_rollback_puts_claims_acks_nacks_and_expiries_back_exactly():
    s = make(keep_results=True)
    for i in range(4):
        s.enqueue(f"j{i}", b"x", 0.0, priority=i % 2)
    s.drain()
    held = s.claim(["w#0", "w#1"], 1.0)
    s.drain()
    s.track_undo()
    before = fingerprint(s)
    s.claim(["w#2", "w#3"], 2.0)  # leases the other two
    s.ack(held[0].job_id, held[0].lease_token or "", 2.5, b"r")  # done (kept)
    s.nack(held[1].job_id, held[1].lease_token or "", 2.5, "boom", RNG)  # back off
    s.sweep(100.0)  # every lease expires
    assert fingerprint(s) != before
    s.rollback(s.take_undo())
    assert fingerprint(s) == before
    assert s.dirty == [] and s.events == []
    # The restored heaps still work: the same two jobs are claimable, the leases still expire.
    assert sorted(claim_ids(s, 4, 3.0)) == sorted({"j0", "j1", "j2", "j3"} - {
        held[0].job_id, held[1].job_id})
    assert s.sweep(100.0) == 4


def test_rollback_restores_purged_dead_letters_and_drops_nothing_else():
    s = make(max_attempts=1)
    s.enqueue("d", b"x", 0.0)
    (rec,) = s.claim(["w#0"], 0.0)
    s.nack("d", rec.lease_token or "", 1.0, "boom", RNG)
    s.track_undo()
    s.take_undo()  # a checkpoint: the dead letter is what storage holds
    before = fingerprint(s)
    assert s.purge_dead(2.0) == 1 and not s.dead
    s.rollback(s.take_undo())
    assert fingerprint(s) == before and list(s.dead) == ["d"]


def test_spared_and_released_leases_do_not_count_and_get_fresh_tokens():
    s = make(max_attempts=1)
    s.enqueue("j", b"x", 0.0)
    (first,) = s.claim(["w#0"], 0.0)
    token = first.lease_token or ""
    assert s.sweep(20.0, spare_claimed_by=5.0) == 1  # claimed at 0, an outage seen at 5
    assert first.state == READY and first.attempts == 0 and not s.dead
    (again,) = s.claim(["w#0"], 21.0)
    assert again.attempts == 1 and again.lease_token != token
    assert s.ack("j", token, 21.5) == "stale"  # the old delivery settles nothing now
    assert s.release("j", again.lease_token or "", 22.0) == "ok"
    assert again.state == READY and again.attempts == 0
    assert again.history[-1].outcome == "released"
    (third,) = s.claim(["w#1"], 23.0)
    assert s.sweep(40.0, spare_claimed_by=10.0) == 1  # the outage was before this claim
    assert third.state == DEAD  # counted: max_attempts=1
