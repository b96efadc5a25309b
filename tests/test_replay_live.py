"""Replay is faithful (issue 27): a live run on real Zenoh with real worker processes, recorded
with ``LiveQueue.arecord``, replayed in the simulator under the same policy, measures the same;
replayed with a lease below the slowest run, it predicts the duplicate runs a live run with that
lease shows.

The workload is fixed by a seed: Poisson arrivals, lognormal run times and a 10% chance of a
nack per attempt, carried in each job's body so the two live runs do the same work; one worker
process is SIGKILLed mid-run in each and started again under its own node id some seconds later
(the trace must see the crash and the return although the slot ids are the same). Arrival
pacing and the restart's delay use sleeps (they *are* the workload); every wait for an outcome
is an event with a generous bound. About 40 s on 2 cores.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_events
from zenoh_util import isolated_configs, unique_prefix, wait_until

from istos import Istos
from istos_nb.attach import aattach
from istos_nb.data.trace import Trace
from istos_nb.sim.replay import replay
from istos_nb.views.compare import predict, run_metrics

PROC = str(Path(__file__).parent / "procs" / "replay_worker.py")
JOBS, RATE, KILL_AT_S = 120, 7.0, 6.0
# The killed worker comes back this long after the kill (plus its start-up), under its own name:
# after its leases ran out and longer than any run, the trace cannot mistake it for a slow job.
RESTART_AFTER_S = 6.0
RUN_MEDIAN_S, RUN_SIGMA = 0.3, 0.6
LEASE_S, SHORT_LEASE_S = 4.0, 0.25
POLICY = {"lease_s": LEASE_S, "max_attempts": 3, "retry_backoff_s": 0.05, "retry_jitter": 0.0}
RECORD_S = 30.0  # covers the arrivals (~17 s) and the drain, also on a loaded machine


def workload(seed: int) -> list[tuple[float, dict[str, Any]]]:
    """(arrival offset, body) per job: the same jobs for every run. A job takes as long on
    every attempt (its run time is its own); each attempt fails with probability 0.1."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(JOBS):
        run = round(rng.lognormvariate(math.log(RUN_MEDIAN_S), RUN_SIGMA), 3)
        fails = [rng.random() < 0.1 for _ in range(4)]
        out.append((t, {"runs": [run] * 4, "fails": fails}))
        t += rng.expovariate(RATE)
    return out


class Worker:
    """One worker OS process; counts the runs it completed (its ``DONE`` lines)."""

    def __init__(self, config: dict[str, Any], prefix: str, node: str, *queues: str) -> None:
        self.args = (config, prefix, node, *queues)
        self.proc = subprocess.Popen(
            [sys.executable, PROC, json.dumps(config), prefix, node, "2", *queues],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.ready = threading.Event()
        self.done: list[str] = []
        self.running = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.strip() == "READY":
                self.ready.set()
            elif line.startswith("START "):
                self.running += 1
            elif line.startswith(("DONE ", "FAIL ")):
                self.running -= 1
                if line.startswith("DONE "):
                    self.done.append(line.split()[1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)


async def drive(owner: Istos, queue: str, jobs: list[tuple[float, dict[str, Any]]],
                workers: dict[str, Worker], victim: str) -> tuple[list[str], float]:
    """Enqueue at the planned offsets, kill ``victim`` at KILL_AT_S and start it again under
    its own name (``workers[victim]`` is then the new process, ``workers[victim + "-old"]``
    the killed one); wait until every job ended. Returns the job ids and the wall-clock time
    of the kill."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    killed_at = [0.0]

    async def kill_while_busy() -> None:
        # killed while it runs a job, so the kill costs a lease (the crash shows)
        old = workers[victim]
        await asyncio.sleep(KILL_AT_S)
        await wait_until(lambda: old.running > 0, 30, "the victim runs a job")
        killed_at[0] = time.time()
        await asyncio.to_thread(old.kill)
        workers[victim + "-old"] = old  # its side effects count too
        await asyncio.sleep(RESTART_AFTER_S)  # the workload: how long the node stays down
        workers[victim] = new = await asyncio.to_thread(Worker, *old.args)
        assert await asyncio.to_thread(new.ready.wait, 60), new.proc.stderr

    killer = asyncio.ensure_future(kill_while_busy())
    ids = []
    for i, (offset, body) in enumerate(jobs):
        await asyncio.sleep(max(0.0, start + offset - loop.time()))
        ids.append(await owner.enqueue(queue, body, job_id=f"{queue}-{i}"))
    await killer
    wanted = set(ids)

    def finished(events: list[Any]) -> bool:
        return wanted <= {e.job_id for e in events
                          if e.kind in ("acked", "dead_lettered") and e.queue == queue}

    await wait_events(owner, finished, timeout_s=90)
    return ids, killed_at[0]


def duplicated_runs(done: list[str], ids: list[str]) -> int:
    counts = Counter(j for j in done if j in set(ids))
    return sum(n - 1 for n in counts.values() if n > 1)


@pytest.mark.timeout(240)
async def test_a_recorded_live_run_replays_faithfully_and_predicts_duplicates():
    configs, prefix = isolated_configs(6), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q1", **POLICY)
    owner.queue("q2", **{**POLICY, "lease_s": SHORT_LEASE_S})
    jobs = workload(27)
    async with owner.serving():
        # Two fleets, one per run, so both runs go at once (the test takes one run's time).
        workers = {name: Worker(configs[i], prefix, name, queue) for i, (name, queue) in
                   enumerate([("wa1", "q1"), ("wb1", "q1"), ("wa2", "q2"), ("wb2", "q2")], 1)}
        lq = None
        try:
            for w in workers.values():
                assert await asyncio.to_thread(w.ready.wait, 60), w.proc.stderr
            lq = await aattach("q1", configs[5], prefix=prefix, timeout_s=10)
            live = threading.Event()
            recording = asyncio.ensure_future(lq.arecord(RECORD_S, on_start=live.set))
            assert await asyncio.to_thread(live.wait, 30)
            (ids1, killed_at), (ids2, _) = await asyncio.gather(
                drive(owner, "q1", jobs, workers, "wb1"), drive(owner, "q2", jobs, workers, "wb2"))
            trace = await asyncio.wait_for(recording, RECORD_S + 60)
        finally:
            for w in workers.values():
                w.kill()
            if lq is not None:
                await lq.aclose()
    ring = Trace.from_events(owner.events.recent(), queue="q1", policy=trace.policy)

    # The recording holds the run as the owner saw it: every job, every event of it.
    assert set(trace.jobs["job_id"]) == set(ids1)
    assert len(trace.attempts) == len(ring.attempts)
    assert trace.policy["lease_s"] == LEASE_S and trace.dropped == 0
    assert set(trace.fleet["node"]) == {"wa1", "wb1"}
    (crash,) = trace.crashes
    # wb1 died at its last act before the kill (or an ack on the wire then) and came back
    # under its own name: one node, two incarnations
    assert crash["node"] == "wb1" and crash["restart_after"] is not None
    died, back = trace.t0 + crash["t"], trace.t0 + crash["t"] + crash["restart_after"]
    assert died < killed_at + 0.5, (died, killed_at)  # (+ an ack on the wire at the kill)
    assert back > killed_at + RESTART_AFTER_S, (back, killed_at)

    recorded = run_metrics(trace)
    same = replay(trace, seed=1)
    replayed = run_metrics(same)
    # the replay kills wb1 at the recorded moment and brings it back when the recording did
    (again,) = Trace.from_events(same.job_events()).crashes
    assert again["node"] == "wb1"
    assert again["t"] + again["restart_after"] == pytest.approx(back - trace.t0, abs=1e-6)
    # Waits as predicted: the mean over replay seeds (predict), as docs/explanation/replay.md
    # defines it. One seed's wait p50 strays: a p50 of ~0.15 s is a few claim round trips, and
    # one draw of the schedule's races moved it by 15.1% once in CI.
    waits = predict(trace, seeds=3).loc[["wait_p50", "wait_p95"], "mean"]
    for q in ("wait_p50", "wait_p95"):
        assert waits[q] == pytest.approx(recorded[q], rel=0.15), (q, recorded, waits, replayed)
    assert (replayed["done"], replayed["dead"]) == (recorded["done"], recorded["dead"])
    assert replayed["attempts_hist"] == recorded["attempts_hist"], (recorded, replayed)
    assert abs(replayed["redeliveries"] - recorded["redeliveries"]) <= 1, (recorded, replayed)
    assert recorded["redeliveries"] >= 1  # the kill cost leases

    live_dups = duplicated_runs([d for name in ("wa2", "wb2", "wb2-old")
                                 for d in workers[name].done], ids2)
    # The prediction is the replays' mean over a few seeds (predict): what the short lease
    # costs on average, not one draw of the races between a late ack and a new claim (one
    # seed strays from the mean by up to ~20%: docs/explanation/replay.md).
    predicted = predict(trace, seeds=3, lease_s=SHORT_LEASE_S).loc["duplicated_runs", "mean"]
    assert live_dups >= 5, live_dups  # the lease really is below the slow runs
    assert predicted == pytest.approx(live_dups, rel=0.20), (predicted, live_dups)
