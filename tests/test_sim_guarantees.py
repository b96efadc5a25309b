"""Simulator tests that see the HA guarantees themselves, not only the final tally (issue 24):
a leader whose storage lease lapsed answers nothing, a write refused by the fence stops the
owner, a late ack (after expiry, before the next claim) is honoured once."""

from __future__ import annotations

import asyncio
import logging

import pytest

from istos.errors import FencedOut
from istos_nb.sim import Simulation

pytestmark = pytest.mark.fast  # `make check`: no process, server or session

HA_LEASE_S = 3.0


def probe_every(sim: Simulation, node: str, queue: str, *, start: float, stop: float,
                step: float, out: list[tuple[float, bool]], timeout_s: float = 2.0) -> None:
    """From ``start`` to ``stop`` (virtual seconds), send one ``stats`` request every ``step``
    from ``node``, each on its own (not waiting for the previous one), and record (time sent,
    answered ok)."""

    async def one(sent: float) -> None:
        try:
            await sim.nodes[node].app.client(queue).call("stats", timeout_s=timeout_s)
            out.append((sent, True))
        except Exception:
            out.append((sent, False))

    async def probe() -> None:
        loop = asyncio.get_running_loop()
        tasks = set()
        while loop.time() < stop:
            task = loop.create_task(one(loop.time()))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            await asyncio.sleep(step)
        await asyncio.gather(*tasks)

    sim.at(start, probe)


def test_a_leader_whose_storage_lease_lapsed_answers_no_request_not_even_a_read():
    """Replica a leads, then freezes at t=20 (shorter than the link lease, so requests still
    reach it and wait, as they would in a stopped process's socket); b takes over and writes.
    The probe reaches a only (partitioned from b). a's lease ran out by 20 + ha_lease_s at the
    latest (every renewal that counted was asked before it froze), so no request sent after
    that may get an ok reply from its stale memory, reads included: when a resumes, requests
    that waited for it are answered with an error before it has reloaded."""
    sim = Simulation(seed=3, storage="durable", link_lease_s=10.0)
    for name in ("a", "b"):
        sim.node(name).queue("q", ha=True, ha_lease_s=HA_LEASE_S, lease_s=5.0)
    sim.node("p")
    sim.enqueue_jobs("p", "q", 5, start=1.0, rate=5.0)
    sim.enqueue_jobs("b", "q", 5, start=24.0, rate=5.0)  # the new leader's writes
    frozen_at = 20.0
    sim.partition({"p"}, {"b"}, at=10.0)
    sim.freeze("a", at=frozen_at, resume_at=frozen_at + 6.0)
    answers: list[tuple[float, bool]] = []
    probe_every(sim, "p", "q", start=15.0, stop=30.0, step=0.05, out=answers, timeout_s=8.0)
    result = sim.run(until=45.0)
    lapsed = frozen_at + HA_LEASE_S
    before = [ok for t, ok in answers if t < frozen_at - 0.1]
    after = sorted(t for t, ok in answers if ok and t > lapsed)
    assert before and all(before)  # the probe works: the leader answered before it froze
    assert [e for e in result.events_raw if e["kind"] == "owner_up" and e["node"] == "b"]
    assert not after, f"a lapsed leader answered {len(after)} request(s), first sent at {after[0]}"


class _LoopTimes(logging.Handler):
    """Records the virtual time of each owner warning whose arguments carry a FencedOut."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.fenced_at: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if any(isinstance(a, FencedOut) for a in args):
            self.fenced_at.append(asyncio.get_running_loop().time())


def test_a_write_refused_by_the_fence_stops_the_owner_at_once():
    """b joins at t=10 with its clock 5 s ahead: a's lease (3 s) always looks expired to it, so
    it takes the epoch while a still believes it leads (a's own clock says its lease runs).
    a's next write (an enqueue every 10 ms reaches it) is refused by the fence: from then on a
    answers nothing, reads included, without waiting for its next renewal to fail."""
    sim = Simulation(seed=5, storage="durable", link_lease_s=10.0)
    sim.node("a").queue("q", ha=True, ha_lease_s=HA_LEASE_S, lease_s=5.0)
    sim.node("b", clock_skew_s=5.0).queue("q", ha=True, ha_lease_s=HA_LEASE_S, lease_s=5.0)
    sim.crash("b", at=0.001, restart_after=10.129)
    sim.node("p")
    # b is cut from a and from the probe and the producer on the mesh (not from the store), so
    # a learns of the new epoch only from the store: its next renewal, or a refused write.
    sim.partition({"a", "p"}, {"b"}, at=0.5)
    sim.enqueue_jobs("p", "q", 1500, start=1.0, rate=100.0)
    answers: list[tuple[float, bool]] = []
    probe_every(sim, "p", "q", start=5.0, stop=14.0, step=0.005, out=answers, timeout_s=1.0)
    seen = _LoopTimes()
    log = logging.getLogger("istos.owner")
    log.addHandler(seen)
    try:
        result = sim.run(until=20.0)
    finally:
        log.removeHandler(seen)
    assert seen.fenced_at, "no write was refused by the fence: the scenario did not happen"
    refused = seen.fenced_at[0]
    assert 10.0 <= refused < 11.0
    assert [e for e in result.events_raw if e["kind"] == "owner_up" and e["node"] == "b"]
    before = [ok for t, ok in answers if t < 9.9]
    late = sorted(t for t, ok in answers if ok and t > refused)
    assert before and all(before)
    assert not late, f"a fenced owner answered {len(late)} request(s), first at {late[0]}"


def _kinds(result, job_id: str) -> list[str]:
    return [e["kind"] for e in result.events_raw if e["job_id"] == job_id]


def test_a_late_ack_before_the_next_claim_is_honoured_and_after_it_is_not():
    """No heartbeat, lease 5 s, a 6 s job: its lease expires while it runs and it goes back to
    ready. Alone (nobody else to claim it), the late ack still ends it: it ran once, one
    claim, acked. With a second worker that claims it in the meantime, the first worker's late
    ack is stale (that delivery is no longer the latest) and the job ends with the second."""
    for rivals in (0, 1):
        sim = Simulation(seed=9, storage="durable")
        sim.node("o").queue("q", lease_s=5.0, max_attempts=3, sweep_interval_s=0.1)
        sim.node("w").worker("q", concurrency=1, poll_interval_s=0.2)(sim.handler(service_s=6.0))
        if rivals:
            sim.node("r").worker("q", concurrency=1, poll_interval_s=0.2)(
                sim.handler(service_s=1.0))
            sim.crash("r", at=0.0, restart_after=5.5)  # arrives after w's claim, before its ack
        sim.enqueue_jobs("o", "q", 1, start=1.0)
        result = sim.run(until=30.0)
        report = result.check()
        assert report["ok"].all(), report[~report["ok"]]
        (job_id,) = {e["job_id"] for e in result.events_raw if e["kind"] == "enqueued"}
        kinds = _kinds(result, job_id)
        ran = [e for e in result.effects if e["job_id"] == job_id]
        assert kinds.count("lease_expired") == 1 and kinds.count("acked") == 1
        if rivals:
            assert kinds.count("claimed") == 2 and len(ran) == 2  # at least once: it ran twice
            (acked,) = [e for e in result.events_raw if e["kind"] == "acked"]
            assert acked["worker"].startswith("r")  # the latest delivery's ack, not w's
        else:
            assert kinds.count("claimed") == 1 and len(ran) == 1  # the late ack was honoured


def test_prefetched_jobs_that_cannot_start_in_time_keep_their_attempt():
    """The simulator runs the real worker: concurrency 1, prefetch 3, lease 10 s, no heartbeat.
    A 12 s job holds the slot (it outlives its own lease: its attempt counts, it ran); the
    three short jobs prefetched behind it would still be waiting when their leases end, so they
    are handed back a tenth of the lease early, attempt not counted, and claimed again: each
    short job runs once, at attempt 1, and never sees its lease expire."""
    sim = Simulation(seed=4, storage="durable")
    sim.node("o").queue("q", lease_s=10.0, max_attempts=2, sweep_interval_s=0.1)
    attempts: dict[str, list[int]] = {}

    async def work(job: dict, ctx) -> None:  # noqa: ANN001
        attempts.setdefault(job["n"], []).append(ctx.attempt)
        await asyncio.sleep(12.0 if job["n"] == "slow" else 0.01)

    sim.node("w").worker("q", concurrency=1, prefetch=3, poll_interval_s=0.2)(work)
    sim.enqueue_jobs("o", "q", 1, start=1.0, data=lambda i: {"n": "slow"})
    sim.enqueue_jobs("o", "q", 3, start=1.001, rate=1000.0, data=lambda i: {"n": f"short{i}"})
    result = sim.run(until=60.0)
    report = result.check()
    assert report["ok"].all(), report[~report["ok"]]
    shorts = {e["job_id"] for e in result.events_raw
              if e["kind"] == "enqueued" and e["job_id"] not in _slow_ids(result)}
    assert all(attempts[f"short{i}"] == [1] for i in range(3)), attempts
    assert not [e for e in result.events_raw
                if e["kind"] in ("lease_expired", "dead_lettered") and e["job_id"] in shorts]
    spared = [e for e in result.events_raw if e["kind"] == "retry_scheduled"
              and e["job_id"] in shorts]
    assert len(spared) == 3 and all(e["detail"].get("spared") for e in spared)
    assert result.counts["ok"] == 4


def _slow_ids(result) -> set[str]:  # noqa: ANN001
    first = sorted((e["t"], e["job_id"]) for e in result.events_raw if e["kind"] == "enqueued")
    return {first[0][1]}
