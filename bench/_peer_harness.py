"""What every peer driver of ``bench/peers.py`` shares: job shape, counting, the round's script.

Imports only the standard library: it is loaded by each peer's driver (``_peer_<name>.py``) in
that peer's own virtualenv, and by ``_peer_istos.py`` in ours. The drivers run as scripts, so
``bench/`` is first on ``sys.path`` and the repository root is not.

One round of one system, run by ``driver.py run SPEC`` (the producer's process):

1. ``drain``: the producer enqueues ``jobs`` jobs with no worker running, then starts the worker
   process (``driver.py worker SPEC``); drain jobs/s = jobs / (last handler return - first
   handler start), both taken in the worker, so the worker's start-up is not counted.
2. ``e2e``: with that worker idle, the producer enqueues ``jobs`` more, awaiting each call, and
   times each call (enqueue p50/p99); e2e jobs/s = jobs / (last handler return - first enqueue).
   ``time.perf_counter`` is CLOCK_MONOTONIC on Linux, one clock for every process on the host.
3. ``pickup``: with the worker idle, ``pickups`` jobs one at a time, ``PICKUP_GAP_S`` apart;
   pickup = the job's handler start (in the worker) minus the moment its enqueue returned,
   taken where the call returned (``timed_loop``'s stamp, on the client's own loop thread for
   async clients), not after the hop back to the harness's thread.
3b. ``pipe``: producers with ``enqueue_pipelined`` (a way to enqueue from one producer without
   waiting one round trip per job) hand over ``jobs`` that way; e2e jobs/s as above.
4. ``procs``: ``producers`` processes (``driver.py produce SPEC``, each attached to what the
   round set up: nothing created, nothing deleted) enqueue ``jobs`` between them, each awaiting
   every call; e2e jobs/s = jobs / (last handler return - the moment all were told to go).
5. ``conc``: this process enqueues ``jobs`` from ``width`` concurrent coroutines (threads, for
   peers with no async client); e2e as above. Peers without ``enqueue_concurrent`` skip it.
6. The worker is stopped, and everything the round created (keys, queues, schema) is deleted.

The worker's handler is a no-op that counts: each job carries its phase, and when a phase's
count reaches ``jobs`` the worker prints ``@@DONE {...}``. The producer prints one
``@@RESULT {...}`` line with the figures (``{"error": ...}`` on failure).
"""

from __future__ import annotations

import json
import math
import queue
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

RESULT_TAG = "@@RESULT "
DONE_TAG = "@@DONE "
READY_TAG = "@@READY"
PICKUP_GAP_S = 0.005


def make_job(i: int, phase: str) -> dict[str, Any]:
    """About 100 bytes encoded (JSON or msgpack alike)."""
    return {"i": i, "phase": phase, "pad": "x" * 66}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class Counter:
    """Counts handled jobs per phase (thread-safe: some peers run handlers on threads)."""

    def __init__(self, target: int, targets: dict[str, int] | None = None) -> None:
        self.target = target
        self.targets = targets or {}  # phases with another count than ``target``
        self._lock = threading.Lock()
        self._count: dict[str, int] = {}
        self._first: dict[str, float] = {}
        self._starts: dict[int, float] = {}  # pickup phase: every job's start

    def start(self, body: Any) -> None:
        """Call when a handler starts (only the first call per phase matters, but in the
        pickup phase every job's start is kept)."""
        phase = _phase(body)
        if phase == "pickup":
            self._starts.setdefault(int(body["i"]), time.perf_counter())
        if phase not in self._first:
            with self._lock:
                self._first.setdefault(phase, time.perf_counter())

    def hit(self, body: Any) -> None:
        """Call when a handler returns; prints ``@@DONE`` at the phase's last job."""
        now = time.perf_counter()
        phase = _phase(body)
        with self._lock:
            self._first.setdefault(phase, now)
            n = self._count.get(phase, 0) + 1
            self._count[phase] = n
        if n == self.targets.get(phase, self.target):
            done: dict[str, Any] = {"phase": phase, "t_first": self._first[phase],
                                    "t_last": now}
            if phase == "pickup":
                done["starts"] = self._starts
            print(DONE_TAG + json.dumps(done), flush=True)


def _phase(body: Any) -> str:
    if isinstance(body, dict):
        return str(body.get("phase", "?"))
    return "?"


class LoopThread:
    """An asyncio loop on its own thread, for async peers driven by this (sync) harness.

    It keeps running between calls, so an owner hosted by the producer serves the worker's
    claims while the harness waits; a timed enqueue loop runs wholly on the loop thread.
    """

    def __init__(self) -> None:
        import asyncio

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Any, timeout_s: float = 300.0) -> Any:
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


LAST_RETURN = [0.0]  # perf_counter() when timed_loop's latest call returned, on its own thread


async def timed_loop(enqueue: Callable[[dict[str, Any]], Any], jobs: list[dict[str, Any]],
                     timed: bool) -> list[float]:
    """Await ``enqueue(job)`` for each job in turn; per-call seconds when ``timed``. The moment
    the last call returned is kept in ``LAST_RETURN`` (the pickup phase starts its clock
    there, not after the hop back to the harness's thread)."""
    perf = time.perf_counter
    samples: list[float] = []
    for job in jobs:
        t = perf()
        await enqueue(job)
        done = perf()
        LAST_RETURN[0] = done
        if timed:
            samples.append(done - t)
    return samples


async def concurrent_loop(enqueue: Callable[[dict[str, Any]], Any],
                          jobs: list[dict[str, Any]], width: int) -> None:
    """``width`` coroutines, each awaiting ``enqueue(job)`` for the next job in turn."""
    import asyncio

    it = iter(jobs)

    async def lane() -> None:
        for job in it:
            await enqueue(job)

    await asyncio.gather(*(lane() for _ in range(width)))


def threaded_loop(enqueue: Callable[[dict[str, Any]], Any], jobs: list[dict[str, Any]],
                  width: int) -> None:
    """``concurrent_loop`` for blocking clients: ``width`` threads."""
    lock = threading.Lock()
    it = iter(jobs)

    def lane() -> None:
        while True:
            with lock:
                job = next(it, None)
            if job is None:
                return
            enqueue(job)

    threads = [threading.Thread(target=lane) for _ in range(width)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def wait_for_stop_line() -> None:
    """In the worker: block until the producer writes a line or closes our stdin."""
    sys.stdin.readline()


class Child:
    """A child process whose stdout lines are read by a thread (tagged lines are kept)."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=env)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def wait_tag(self, tag: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"child sent no {tag.strip()!r} within {timeout_s:g} s"
                                   ) from None
            if line is None:
                raise RuntimeError(f"child exited (code {self.proc.wait()}) before "
                                   f"{tag.strip()!r}")
            if line.startswith(tag):
                return line[len(tag):]
            print(f"[child] {line}", file=sys.stderr)

    def stop(self, timeout_s: float = 20.0) -> None:
        """Write the stop line, wait; kill if it does not exit in time."""
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write("stop\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Producer(Protocol):
    """The producer side of one peer for one round."""

    def enqueue_all(self, jobs: list[dict[str, Any]], timed: bool) -> list[float]:
        """Enqueue each job, awaiting each call; return per-call seconds when ``timed``."""

    def close(self) -> None:
        """Release connections and delete everything this round created (an attached
        producer, ``spec["attach"]``, created nothing and deletes nothing)."""

    # Optional: ``enqueue_pipelined(jobs)``, every job from this one producer without waiting
    # one round trip each, returning once each is accepted (the ``pipe`` phase);
    # ``enqueue_concurrent(jobs, width)`` (the ``conc`` phase).


def pickup_phase(spec: dict[str, Any], producer: Producer, worker: Child,
                 timeout: float) -> dict[str, Any]:
    """Idle-worker pickup latency, one job at a time (see the module docstring)."""
    n = int(spec.get("pickups", 0))
    if not n:
        return {}
    replies: dict[int, float] = {}
    for i in range(n):
        called = time.perf_counter()
        producer.enqueue_all([make_job(i, "pickup")], timed=False)
        returned = time.perf_counter()
        # The stamp where the call returned, when the client ran it on a loop thread of ours
        # (a sync client calls in this thread: then it is this thread's clock reading).
        replies[i] = LAST_RETURN[0] if called < LAST_RETURN[0] <= returned else returned
        time.sleep(PICKUP_GAP_S)  # (a bench: lets the worker go idle again)
    done = json.loads(worker.wait_tag(DONE_TAG, timeout))
    starts = done["starts"]
    ms = [(starts[str(i)] - t) * 1e3 for i, t in replies.items() if str(i) in starts]
    return {"pickup_p50_ms": percentile(ms, 50), "pickup_p99_ms": percentile(ms, 99)}


def procs_phase(spec: dict[str, Any], worker: Child, producer_argv: list[str],
                timeout: float) -> float:
    """``producers`` processes enqueue ``jobs`` between them, sequentially each; e2e jobs/s."""
    jobs, n = int(spec["jobs"]), int(spec["producers"])
    children = [Child([*producer_argv, json.dumps({**spec, "attach": True, "slot": k,
                                                    "share": [k, n]})]) for k in range(n)]
    try:
        for child in children:
            child.wait_tag(READY_TAG, 120)
        t0 = time.perf_counter()
        for child in children:
            assert child.proc.stdin is not None
            child.proc.stdin.write("go\n")
            child.proc.stdin.flush()
        done = json.loads(worker.wait_tag(DONE_TAG, timeout))
        return jobs / (done["t_last"] - t0)
    finally:
        for child in children:
            child.stop()


def run_producer_child(spec: dict[str, Any],
                       make_producer: Callable[[dict[str, Any]], Producer]) -> None:
    """``driver.py produce SPEC``: one of the ``procs`` phase's producers."""
    k, n = spec["share"]
    mine = [make_job(i, "procs") for i in range(int(spec["jobs"])) if i % n == k]
    producer = make_producer(spec)
    try:
        print(READY_TAG, flush=True)
        sys.stdin.readline()  # go
        producer.enqueue_all(mine, timed=False)
        sys.stdin.readline()  # stop
    finally:
        producer.close()


def run_round(spec: dict[str, Any], make_producer: Callable[[dict[str, Any]], Producer],
              worker_argv: list[str], producer_argv: list[str]) -> dict[str, Any]:
    """Run one round (see the module docstring) and return its figures."""
    jobs = int(spec["jobs"])
    timeout = 60.0 + jobs / 20.0
    producer = make_producer(spec)
    worker: Child | None = None
    try:
        producer.enqueue_all([make_job(i, "drain") for i in range(jobs)], timed=False)
        worker = Child(worker_argv)
        drain = json.loads(worker.wait_tag(DONE_TAG, timeout))
        batch = [make_job(i, "e2e") for i in range(jobs)]
        t0 = time.perf_counter()
        samples = producer.enqueue_all(batch, timed=True)
        t_enq = time.perf_counter()
        e2e = json.loads(worker.wait_tag(DONE_TAG, timeout))
        if e2e["phase"] != "e2e" or drain["phase"] != "drain":
            raise RuntimeError(f"phases out of order: {drain}, {e2e}")
        ms = [s * 1e3 for s in samples]
        result: dict[str, Any] = {
            "drain_jobs_s": jobs / (drain["t_last"] - drain["t_first"]),
            "e2e_jobs_s": jobs / (e2e["t_last"] - t0),
            "enqueue_p50_ms": percentile(ms, 50), "enqueue_p99_ms": percentile(ms, 99),
            "enqueue_phase_s": t_enq - t0,
        }
        result.update(pickup_phase(spec, producer, worker, timeout))
        pipelined = getattr(producer, "enqueue_pipelined", None)
        if pipelined is not None:
            t0 = time.perf_counter()
            pipelined([make_job(i, "pipe") for i in range(jobs)])
            done = json.loads(worker.wait_tag(DONE_TAG, timeout))
            result["pipe_e2e_jobs_s"] = jobs / (done["t_last"] - t0)
        if int(spec.get("producers", 0)):
            result["procs_e2e_jobs_s"] = procs_phase(spec, worker, producer_argv, timeout)
        conc = getattr(producer, "enqueue_concurrent", None)
        if conc is not None and int(spec.get("width", 0)):
            t0 = time.perf_counter()
            conc([make_job(i, "conc") for i in range(jobs)], int(spec["width"]))
            done = json.loads(worker.wait_tag(DONE_TAG, timeout))
            result["conc_e2e_jobs_s"] = jobs / (done["t_last"] - t0)
        return result
    finally:
        if worker is not None:
            worker.stop()
        producer.close()


def main(argv: list[str], make_producer: Callable[[dict[str, Any]], Producer],
         run_worker: Callable[[dict[str, Any], Counter], None]) -> None:
    """``driver.py run SPEC`` (one round, prints @@RESULT) or ``driver.py worker SPEC``."""
    mode, spec = argv[1], json.loads(argv[2])
    if mode == "worker":
        run_worker(spec, Counter(int(spec["jobs"]),
                                 {"pickup": int(spec.get("pickups", 0))}))
        return
    if mode == "produce":
        run_producer_child(spec, make_producer)
        return
    try:
        result = run_round(spec, make_producer,
                           [sys.executable, "-u", argv[0], "worker", argv[2]],
                           [sys.executable, "-u", argv[0], "produce"])
    except Exception as exc:  # reported, not raised: the orchestrator goes on with the others
        traceback.print_exc(file=sys.stderr)
        result = {"error": f"{type(exc).__name__}: {exc}"}
    print(RESULT_TAG + json.dumps(result), flush=True)
