"""Replay is faithful (issue 27): a live run on real Zenoh with real worker processes, recorded
with ``LiveQueue.arecord``, replayed in the simulator under the same policy, measures the same;
replayed with a lease below the slowest run, it predicts the duplicate runs a live run with that
lease shows.

The workload is fixed by a seed: Poisson arrivals, lognormal run times and a 10% chance of a
nack per attempt, carried in each job's body so the two live runs do the same work; one worker
process is SIGKILLed mid-run in each and started again under its own node id some seconds later
(the trace must see the crash and the return although the slot ids are the same). Arrival
pacing and the restart's delay use sleeps (they *are* the workload); every wait for an outcome
is an event with a generous bound. About 30 s on 2 cores; ``solo`` under xdist (the live run's
timing is what replay is compared with, so no other test of the run loads the machine
meanwhile): run beside the other tests, the prediction fell outside its bound (24.4 predicted
against 20 live duplicates, a ratio of 1.22) although the bounds below come from runs under a
1-min load of 6-12, so the suite's own load pattern is not the one they were measured under.

How the bounds were computed (each fails a correct engine less than once in 1,000 runs). The
prediction is compared with one live run, whose own timing varies from run to run, so the
bounds come from the spread of the ratio prediction / live over repeated runs of this test
(workload seed 27, PREDICT_SEEDS replay seeds): 15 runs on the 2-core machine under a 1-min
load of 6-12, plus one earlier CI failure (19.0 predicted with 3 seeds, 26 live):

* duplicated runs, predicted / live: measured with ``python -m bench.replay_faithfulness``
  (this test's workload, policy and fleet; ten runs with the restart, ten without, alternating),
  with the replay that subtracts the simulated network's hops from each recorded run and the
  worker that counts a parked claim's leases from the hand-out. With the restart (as here):
  mean 1.008, sd 0.036 over n = 10 (live counts 19-23; range 0.948-1.045; the mean's t against
  1 is 0.7, no bias the spread does not explain). A new run's ratio lies in
  mean +- t * sd * sqrt(1 + 1/n) with probability 0.999 for t = 4.781 (Student's t, 9 degrees
  of freedom, two-sided 0.001): [0.825, 1.191], taken as DUPS_RATIO = (0.82, 1.20). One run
  cannot tell a 10% bias from the spread: a replay as biased as the old one (0.905, sd 0.078
  here) falls below 0.82 in about one run in seven, so a biased replay shows as repeated
  failures, and the bench's mean is the sharper check.
* wait p50, predicted / recorded: mean 1.011, sd 0.052 over n = 15 (a p50 of 0.2-1.6 s is a
  few claim round trips, so one run's schedule moves it by several per cent): t = 4.140 (14
  degrees of freedom) gives [0.788, 1.234], taken as P50_RATIO = (0.78, 1.24).
* wait p95, predicted / recorded: mean 1.010, sd 0.009 over n = 15: the same computation gives
  [0.972, 1.049]; the test keeps 15% (P95_REL), more than 10 sd away.

The normal model behind t is an assumption: a heavier tail than the runs measured shows up as
failures of this test, and those runs are the sample to extend when it does.
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
PREDICT_SEEDS = 5  # predict(): the mean of replays over seeds 0-4
DUPS_RATIO = (0.82, 1.20)  # predicted / live duplicated runs (module docstring: how)
P50_RATIO = (0.78, 1.24)  # predicted / recorded wait p50
P95_REL = 0.15  # predicted wait p95 against the recorded one


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


@pytest.mark.solo
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
    # defines it.
    waits = predict(trace, seeds=PREDICT_SEEDS).loc[["wait_p50", "wait_p95"], "mean"]
    p50_ratio = waits["wait_p50"] / recorded["wait_p50"]
    print(f"wait p50: recorded {recorded['wait_p50']:.3f} s, predicted {waits['wait_p50']:.3f} s")
    assert P50_RATIO[0] <= p50_ratio <= P50_RATIO[1], (p50_ratio, recorded, waits, replayed)
    assert waits["wait_p95"] == pytest.approx(recorded["wait_p95"], rel=P95_REL), (
        recorded, waits, replayed)
    assert (replayed["done"], replayed["dead"]) == (recorded["done"], recorded["dead"])
    assert replayed["attempts_hist"] == recorded["attempts_hist"], (recorded, replayed)
    assert abs(replayed["redeliveries"] - recorded["redeliveries"]) <= 1, (recorded, replayed)
    assert recorded["redeliveries"] >= 1  # the kill cost leases

    live_dups = duplicated_runs([d for name in ("wa2", "wb2", "wb2-old")
                                 for d in workers[name].done], ids2)
    # The prediction is the replays' mean over a few seeds (predict): what the short lease
    # costs on average, not one draw of the races between a late ack and a new claim.
    predicted = predict(trace, seeds=PREDICT_SEEDS,
                        lease_s=SHORT_LEASE_S).loc["duplicated_runs", "mean"]
    print(f"duplicated runs: live {live_dups}, predicted {predicted:.2f}")
    assert live_dups >= 5, live_dups  # the lease really is below the slow runs
    ratio = predicted / live_dups
    assert DUPS_RATIO[0] <= ratio <= DUPS_RATIO[1], (predicted, live_dups)
