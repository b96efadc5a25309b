"""replay: run a recorded trace again on the real engine under virtual time, another policy.

The recorded arrivals enter at their recorded times (through the owner node, with their job
ids, priorities, delays and start deadlines); attempt ``k`` of a job behaves as the trace's
attempt ``k`` did (the same run time, then the same ack or nack), and worker nodes that died in
the trace die at the same moments. What the replay changes is the schedule: the policy (``lease_s``,
``max_attempts``, backoff, ``heartbeat``, ``timeout_s``, ``prefetch``) and the fleet
(``workers``, ``concurrency``).

What replay assumes, and where that breaks (docs/explanation/replay.md says it too):

- A job's behaviour does not depend on the schedule: attempt ``k`` takes as long and ends the
  same way whenever and wherever it runs. Jobs that slow down under load, fail because of a
  neighbour, or succeed on a retry *because* time passed, are replayed as they happened.
- The recorded run time is claim to ack/nack on the owner's clock, so it includes the two
  network hops (the claim's reply, the ack) and any wait of a prefetched job for a free slot.
  The simulated network adds its own two hops again, so a replayed attempt runs the recorded
  time less their mean: its ack reaches the owner when the recorded one did. (Not subtracting
  them made every replayed run a round trip longer; near saturation that lengthened the
  queue, and fewer expired leases found a free slot before the late ack: the duplicates read
  about 5% low.) Replays default to
  ``prefetch=0``, which is faithful when the recorded workers did not prefetch either (and
  ``poll_interval_s=5``: the owner's nudges wake idle workers, and none is lost in replay).
- An attempt the trace does not have (a job that now runs more often, e.g. under a shorter
  lease) takes as long as the job's latest recorded run (a run time belongs to the job) and
  draws its outcome from the trace's finished deliveries, seeded; a job with no finished
  delivery in the trace draws its run time with that outcome. A lease
  that ran out while its node lived on (the job ran past its lease) has no run time in the
  trace: it is drawn from the recorded run times longer than that lease (at least the lease).
- A crash replays as the losses it caused, not as a fresh accident: each delivery it cost is
  lost at the crash's moment on whichever node now runs it (at once if it starts later), so
  the job needs the same attempts. The crashed node stops claiming at that moment, finishes
  what else it runs (in the recording those runs were not lost) for up to the longest recorded
  run or the lease, whichever is shorter, or until it came back if that was sooner, then dies
  (and comes back when it did); with heartbeats on, its lost deliveries' leases are renewed
  until then, so they come back that much later than a real crash's would. A live crash is
  dated by the node's last act before it abandoned what it held, and its return by its next
  act (see :mod:`istos_nb.data.trace_crashes`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from ..data.trace import Trace
from .errors import ScenarioError
from .result import SimResult
from .simnode import SimNode
from .simulation import Simulation
from .workload import HandlerFailure

__all__ = ["replay", "QUEUE_OPTIONS", "WORKER_OPTIONS"]

QUEUE_OPTIONS = ("lease_s", "max_attempts", "retry_backoff_s", "retry_backoff_max_s",
                 "retry_jitter", "sweep_interval_s")
WORKER_OPTIONS = ("heartbeat", "timeout_s", "prefetch", "poll_interval_s")
LEAD_S = 1.0  # virtual seconds for the nodes to boot and find each other before arrivals
_AFTER_LOSS_S = 0.001  # a replayed crash stops its node this long after its losses
_DRAIN_S = 1e6  # ...and lets the runs it holds that the crash did not cost finish
_FOREVER_S = 1e9
OWNER = "owner"

# (acked | nacked | crash | slow, seconds, error); a crash: (crash, its time, its node)
Behaviour = tuple[str, float, str | None]


def replay(trace: Trace, *, seed: int = 0, workers: int | None = None,
           concurrency: int | None = None, until: float | None = None,
           progress: Callable[[float, float], None] | str | None = None,
           **policy: Any) -> SimResult:
    """Replay ``trace`` in a fresh :class:`Simulation` and return its result.

    ``workers``: that many worker nodes (``worker-0``...) instead of the recorded fleet;
    ``concurrency``: slots per worker node (default: each recorded node's). ``policy``: any of
    :data:`QUEUE_OPTIONS` and :data:`WORKER_OPTIONS`, overriding the recorded policy.
    ``until``: virtual seconds to run (default: the trace's span plus time for every retry to
    finish). Raises ScenarioError for an unknown option or an empty trace, ConfigError (from
    the engine) for a bad value. Result times are virtual seconds; arrivals start at
    ``LEAD_S``.
    """
    unknown = sorted(set(policy) - set(QUEUE_OPTIONS) - set(WORKER_OPTIONS))
    if unknown:
        raise ScenarioError(f"replay: unknown option(s) {unknown}; policy options are "
                            f"{', '.join(QUEUE_OPTIONS + WORKER_OPTIONS)}")
    if trace.jobs.empty:
        raise ScenarioError("replay: the trace has no enqueued job (record for longer?)")
    queue_opts = {k: v for k, v in trace.policy.items() if k in QUEUE_OPTIONS}
    queue_opts.update({k: v for k, v in policy.items() if k in QUEUE_OPTIONS})
    # The owner nudges idle workers when jobs become claimable, and the simulated network
    # loses none of those nudges unless told to: a long poll only saves idle virtual work.
    worker_opts: dict[str, Any] = {"prefetch": 0, "poll_interval_s": 5.0}
    worker_opts.update({k: v for k, v in policy.items() if k in WORKER_OPTIONS})
    sim = Simulation(seed=seed)
    queue = trace.queue or "q"
    sim.node(OWNER).queue(queue, **queue_opts)
    plan = _fleet(trace, workers, concurrency)
    nodes = {name: sim.node(name) for name in plan}
    crashes = _crashes(trace, plan)
    _schedule_crashes(sim, trace, crashes, _drain_s(trace, queue_opts))
    lo, hi = sim.net.latency_s
    handle = _handler(behaviours(trace, crashes), random.Random(f"{seed}:replay"),
                      hops_s=lo + hi)  # two hops of mean (lo + hi) / 2
    for name, slots in plan.items():
        nodes[name].worker(queue, concurrency=slots, **worker_opts)(handle)
    owner = sim.nodes[OWNER]
    for job in trace.jobs.itertuples(index=False):
        # A recorded start deadline holds in the replay too (after the same arrival).
        deadline = {"expires_s": float(job.expires_s)} \
            if float(job.expires_s) > float(job.delay_s) else {}
        sim.at(LEAD_S + float(job.arrival), owner.enqueue, queue, {"trace_job": job.job_id},
               job_id=job.job_id, priority=int(job.priority), delay_s=float(job.delay_s),
               **deadline)
    return sim.run(until if until is not None else _until(trace, queue_opts),
                   progress=progress)


def _fleet(trace: Trace, workers: int | None, concurrency: int | None) -> dict[str, int]:
    """Worker node name -> slots."""
    for name, value in (("workers", workers), ("concurrency", concurrency)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 1):
            raise ScenarioError(f"replay: {name} must be an integer >= 1, got {value!r}")
    recorded = {str(r.node): int(r.concurrency) for r in trace.fleet.itertuples()}
    if workers is None:
        if not recorded:
            raise ScenarioError("replay: the trace shows no worker; pass workers=N")
        return {node: concurrency or slots for node, slots in recorded.items()}
    slots = concurrency or (max(recorded.values()) if recorded else 1)
    return {f"worker-{i}": slots for i in range(workers)}


def _crashes(trace: Trace, plan: dict[str, int]) -> list[tuple[str, float] | None]:
    """Per recorded crash (in :attr:`Trace.crashes` order): the replay node that crashes for
    it and the virtual time, or None when no replay node stands for the crashed one."""
    recorded = [str(n) for n in trace.fleet["node"]]
    names = list(plan)
    out: list[tuple[str, float] | None] = []
    for crash in trace.crashes:
        node, at = crash["node"], LEAD_S + max(0.0, float(crash["t"]))
        if node in plan:
            out.append((node, at))
        elif node in recorded:  # a synthetic fleet: the i-th recorded node is worker-(i mod n)
            out.append((names[recorded.index(node) % len(names)], at))
        else:
            out.append(None)
    return out


def _schedule_crashes(sim: Simulation, trace: Trace, crashes: list[tuple[str, float] | None],
                      drain_s: float) -> None:
    """Each crashed node stops claiming just after its crash's moment, finishes the runs the
    crash did not cost (for up to ``drain_s``), then dies, and comes back if the recorded node
    did (at the recorded moment)."""
    for crash, planned in zip(trace.crashes, crashes, strict=True):
        if planned is None:
            continue
        node, t = planned
        sim.at(t + _AFTER_LOSS_S, _go_away, sim.nodes[node])
        back = crash["restart_after"]
        # A node back sooner than the drain takes dies at that moment, cutting its drain short:
        # the recorded node was gone in between, whatever the replay has it run.
        lasts = drain_s if back is None else min(drain_s, float(back))
        sim.crash(node, at=t + lasts,
                  restart_after=None if back is None else max(0.0, float(back) - lasts))


async def _go_away(node: SimNode) -> None:
    """Stop claiming and leave once what the node runs has finished: in the recording those
    runs were not lost (they ran, here or elsewhere), so the replay does not lose them."""
    await node.app.stop(grace_s=_DRAIN_S)


def behaviours(trace: Trace, crashes: list[tuple[str, float] | None]
               ) -> dict[tuple[str, int], Behaviour]:
    """What each recorded delivery did, keyed by (job_id, attempt); a crashed one carries the
    replay node that crashes for it and when."""
    lease = float(trace.policy.get("lease_s") or 30.0)
    out: dict[tuple[str, int], Behaviour] = {}
    for a in trace.attempts.itertuples(index=False):
        key = (str(a.job_id), int(a.attempt))
        planned = crashes[int(a.crash)] if a.crashed else None
        if a.outcome in ("acked", "nacked"):
            out[key] = (str(a.outcome), float(a.run_s), a.error)
        elif a.outcome == "expired" and planned is not None:
            node, t = planned
            out[key] = ("crash", t, node)
        elif a.outcome == "expired":  # ran past its lease: how long is not in the trace
            out[key] = ("slow", lease, None)
    return out


def _handler(table: dict[tuple[str, int], Behaviour], rng: random.Random,
             hops_s: float = 0.0) -> Callable[..., Any]:
    finished = [b for b in table.values() if b[0] in ("acked", "nacked")]
    runs = sorted(b[1] for b in finished)
    own: dict[str, float] = {}  # a job's latest recorded run time
    for (job_id, _attempt), b in sorted(table.items()):
        if b[0] in ("acked", "nacked"):
            own[job_id] = b[1]

    def draw(job_id: str) -> Behaviour:
        """An attempt the trace lacks: the outcome drawn from the queue's finished deliveries,
        the run time the job's own (its latest recorded one; else drawn with the outcome)."""
        kind, seconds, error = rng.choice(finished) if finished else ("acked", 0.0, None)
        return kind, own.get(job_id, seconds), error

    async def handle(job: Any, ctx: Any) -> None:
        loop = asyncio.get_running_loop()
        key = (str(job.get("trace_job")) if isinstance(job, dict) else "", int(ctx.attempt))
        kind, seconds, error = table.get(key) or draw(key[0])
        if kind == "crash":
            # Lost with its node's crash, holding a slot until then wherever it runs now (the
            # slot it took in the recording was busy until the crash too). On the crashing
            # node it is still held when that node dies.
            wait = seconds - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if str(ctx.worker).split(":", 1)[0] == error:
                await asyncio.sleep(_FOREVER_S)
            raise asyncio.CancelledError("delivery lost (replayed crash)")
        if kind == "slow":
            longer = [r for r in runs if r > seconds]
            kind, seconds = "acked", rng.choice(longer) if longer else seconds * 1.25
        await asyncio.sleep(max(0.0, seconds - hops_s))  # the network adds the hops back
        if kind == "nacked":
            raise HandlerFailure(error or "replayed failure")

    return handle


def _drain_s(trace: Trace, queue_opts: dict[str, Any]) -> float:
    """How long a crashing node may finish its other runs: the longest recorded run, and never
    past the replay's lease (a run drained past its lease would run twice, which the recorded
    crash, having killed it, never did)."""
    runs = trace.run_times()
    longest = float(runs.max()) + 0.5 if len(runs) else 1.0
    return min(longest, float(queue_opts.get("lease_s", 30.0)))


def _until(trace: Trace, queue_opts: dict[str, Any]) -> float:
    """Enough virtual time for the last arrival's every attempt and backoff."""
    lease = float(queue_opts.get("lease_s", 30.0))
    attempts = int(queue_opts.get("max_attempts", 5))
    base = float(queue_opts.get("retry_backoff_s", 1.0))
    cap = float(queue_opts.get("retry_backoff_max_s", 600.0))
    longest = max(trace.run_times().max() if len(trace.run_times()) else 0.0, lease)
    backoffs = sum(min(cap, base * 2 ** i) * 1.1 for i in range(attempts))
    return LEAD_S + trace.span_s + attempts * longest + backoffs + 30.0
