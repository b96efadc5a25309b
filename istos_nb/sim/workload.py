"""Workload helpers: arrivals (at once, at a rate, Poisson), service times, failures.

All randomness comes from the World's workload rng, derived from the simulation's seed.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from .errors import ScenarioError

if TYPE_CHECKING:
    from .world import World

ServiceSpec = float | tuple[Any, ...] | Callable[[random.Random], float]


class HandlerFailure(Exception):
    """The failure a workload handler raises with its configured probability."""


def sampler(spec: ServiceSpec, rng: random.Random) -> Callable[[], float]:
    """Turn a service-time spec into a function drawing seconds.

    ``1.5`` (constant), ``("exp", mean)``, ``("uniform", lo, hi)``,
    ``("lognormal", mu, sigma)``, or a callable taking the rng.
    """
    if callable(spec):
        return lambda: float(spec(rng))  # type: ignore[operator]
    if isinstance(spec, (int, float)):
        if spec < 0:
            raise ScenarioError(f"service time must be >= 0, got {spec!r}")
        value = float(spec)
        return lambda: value
    kind, *args = spec
    if kind == "exp" and len(args) == 1 and args[0] > 0:
        return lambda: rng.expovariate(1.0 / args[0])
    if kind == "uniform" and len(args) == 2 and 0 <= args[0] <= args[1]:
        return lambda: rng.uniform(args[0], args[1])
    if kind == "lognormal" and len(args) == 2 and args[1] >= 0:
        return lambda: rng.lognormvariate(args[0], args[1])
    raise ScenarioError(f"unknown or invalid service time spec {spec!r}")


class Workload:
    """Arrivals and handlers of a scenario, scheduled on ``world`` with its workload rng."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.rng = world.workload_rng

    def enqueue_jobs(self, node: str, queue: str, n: int, *, rate: float | None = None,
                     poisson: bool = False, start: float = 0.0,
                     data: Callable[[int], Any] | None = None, priority: int = 0) -> None:
        """Enqueue ``n`` jobs through ``node`` from ``start``: all at once (``rate=None``), one
        every ``1/rate`` s, or as a Poisson process of that rate (``poisson=True``)."""
        sim_node = self.world.node(node)
        if not isinstance(n, int) or n < 0:
            raise ScenarioError(f"n must be an integer >= 0, got {n!r}")
        if rate is not None and not rate > 0:
            raise ScenarioError(f"rate must be > 0 jobs/s, got {rate!r}")
        if poisson and rate is None:
            raise ScenarioError("poisson=True needs a rate")
        make = data or (lambda i: {"i": i})
        t = float(start)
        for i in range(n):
            if rate is not None and i > 0:
                t += self.rng.expovariate(rate) if poisson else 1.0 / rate
            self.world.at(t, sim_node.enqueue, queue, make(i), priority=priority)

    def enqueue_children(self, node: str, queue: str, n: int, *, parents_of: tuple[str, ...],
                         fan_in: int = 2, rate: float = 1.0, start: float = 0.0,
                         on_parent_failure: str = "cancel") -> None:
        """Enqueue ``n`` children through ``node``, one every ``1/rate`` s from ``start``, each
        waiting (``after=``) for up to ``fan_in`` parents drawn among the jobs already
        accepted on the queues ``parents_of`` (``SimNode.enqueue_after``)."""
        sim_node = self.world.node(node)
        if not isinstance(n, int) or n < 0 or not rate > 0 or not isinstance(fan_in, int) \
                or fan_in < 1 or not parents_of:
            raise ScenarioError("enqueue_children needs n >= 0, rate > 0, fan_in >= 1 and "
                                "parent queues")
        for i in range(n):
            self.world.at(start + i / rate, sim_node.enqueue_after, queue, {"child": i},
                          parents_of=tuple(parents_of), fan_in=fan_in,
                          on_parent_failure=on_parent_failure)

    def outbox_transactions(self, queue: str, n: int, *, rate: float | None = None,
                            start: float = 0.0, commit_p: float = 0.8, rows: int = 1) -> None:
        """``n`` application transactions from ``start`` (all at once, or one every ``1/rate``
        s), each writing ``rows`` outbox rows for ``queue`` and committing with probability
        ``commit_p`` (else rolling back). Job ids come from the workload rng."""
        from .errors import ScenarioError

        if not isinstance(n, int) or n < 0 or not isinstance(rows, int) or rows < 1:
            raise ScenarioError(f"n must be >= 0 and rows >= 1, got {n!r}, {rows!r}")
        if rate is not None and not rate > 0:
            raise ScenarioError(f"rate must be > 0 transactions/s, got {rate!r}")
        if not 0.0 <= commit_p <= 1.0:
            raise ScenarioError(f"commit_p must be a probability, got {commit_p!r}")
        t = float(start)
        for i in range(n):
            if rate is not None and i > 0:
                t += 1.0 / rate
            commit = self.rng.random() < commit_p
            ids = [f"ob-{self.rng.getrandbits(64):016x}" for _ in range(rows)]
            self.world.schedule(t, "outbox_transaction", functools.partial(
                self.world.outbox.transaction, queue, i, ids, commit))

    def open_batches(self, node: str, n: int, *, members: dict[str, int], callbacks: str,
                     start: float = 0.0, every: float = 1.0, close: bool = True) -> None:
        """``n`` batch scenarios through ``node``, one every ``every`` s from ``start``: each
        opens a batch whose callbacks (and home) are on queue ``callbacks``, adds ``members``
        (queue -> how many, interleaved; job ids from the workload rng) and closes it
        (``close``). See ``batches.py``."""
        sim_node = self.world.node(node)
        _check_scenarios(n, every)
        if not members or any(type(k) is not int or k < 0 for k in members.values()):
            raise ScenarioError(f"members must map queues to counts >= 0, got {members!r}")
        size = sum(members.values())
        for i in range(n):
            ids = [f"bm-{self.rng.getrandbits(64):016x}" for _ in range(size)]
            self._schedule_run(start + i * every, "open_batch", sim_node, functools.partial(
                self.world.batches.run_one, sim_node, dict(members), callbacks, ids, close))

    def open_chords(self, node: str, n: int, *, queue: str, size: int, callback: str,
                    cancel: int = 0, start: float = 0.0, every: float = 1.0) -> None:
        """``n`` chord scenarios through ``node``, one every ``every`` s from ``start``: each
        opens a chord of ``size`` members on ``queue`` with its callback on ``callback``, then
        cancels its last ``cancel`` members. See ``chord_workload.py``."""
        sim_node = self.world.node(node)
        _check_scenarios(n, every)
        if type(size) is not int or size < 1:
            raise ScenarioError(f"size must be an integer >= 1, got {size!r}")
        if type(cancel) is not int or not 0 <= cancel <= size:
            raise ScenarioError(f"cancel must be an integer in [0, size], got {cancel!r}")
        for i in range(n):
            self._schedule_run(start + i * every, "open_chord", sim_node, functools.partial(
                self.world.chords.run_one, sim_node, queue, size, callback, cancel))

    def open_chains(self, node: str, n: int, *, queues: list[str], start: float = 0.0,
                    every: float = 1.0) -> None:
        """``n`` chains started through ``node``, one every ``every`` s from ``start``, each
        running its steps on ``queues`` in order. See ``chain_workload.py``."""
        sim_node = self.world.node(node)
        _check_scenarios(n, every)
        if isinstance(queues, str) or not queues:
            raise ScenarioError(f"queues must be a non-empty list of names, got {queues!r}")
        for i in range(n):
            self._schedule_run(start + i * every, "open_chain", sim_node, functools.partial(
                self.world.chains.run_one, sim_node, list(queues)))

    def _schedule_run(self, t: float, what: str, node: Any,
                      run: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """At ``t``, run ``run()`` (a scenario's coroutine, made then) as ``node``'s task."""
        self.world.schedule(t, what, lambda: self.world.spawn(node, run()))

    def handler(self, *, service_s: ServiceSpec = 0.0, fail_p: float = 0.0,
                crash_p: float = 0.0, effect: Callable[[Any], Any] | None = None,
                log_lines: int = 0, log_line_bytes: int = 0) -> Callable[..., Any]:
        """A worker function: waits a service time (virtual seconds); then, with probability
        ``crash_p``, the delivery dies mid-job (no ack, no nack: the lease brings it back);
        with probability ``fail_p`` it raises (a nack); otherwise it calls ``effect(job)``.

        ``log_lines``: each attempt writes that many ``ctx.log`` lines, half before its
        service time and half after (so heartbeats carry some), each padded to
        ``log_line_bytes`` characters when that is larger; no randomness is drawn for them."""
        _check_handler_options(fail_p, crash_p, log_lines, log_line_bytes)
        draw = sampler(service_s, self.rng)
        rng = self.rng
        early = log_lines // 2

        def write(ctx: Any, lines: range) -> None:
            for i in lines:
                ctx.log(f"{ctx.job_id} try {ctx.attempt} line {i}".ljust(log_line_bytes, "."))

        async def handle(job: Any, ctx: Any = None) -> Any:
            if log_lines and ctx is not None:
                write(ctx, range(early))
            await asyncio.sleep(draw())
            if log_lines and ctx is not None:
                write(ctx, range(early, log_lines))
            if crash_p and rng.random() < crash_p:
                if ctx is not None:  # the heartbeat invariant needs to know (checker_leases)
                    self.world.node_event(ctx.worker.rsplit(":", 1)[0], "delivery_crashed",
                                         job_id=ctx.job_id)
                raise asyncio.CancelledError("delivery crashed (simulated)")
            if fail_p and rng.random() < fail_p:
                raise HandlerFailure("simulated handler failure")
            return effect(job) if effect is not None else None

        return handle


def _check_scenarios(n: int, every: float) -> None:
    """A scenario count and spacing: ``n`` an integer >= 0, ``every`` > 0 s."""
    if not isinstance(n, int) or n < 0:
        raise ScenarioError(f"n must be an integer >= 0, got {n!r}")
    if not every > 0:
        raise ScenarioError(f"every must be > 0 s, got {every!r}")


def _check_handler_options(fail_p: float, crash_p: float, log_lines: int,
                           log_line_bytes: int) -> None:
    for name, p in (("fail_p", fail_p), ("crash_p", crash_p)):
        if not 0.0 <= p <= 1.0:
            raise ScenarioError(f"{name} must be a probability, got {p!r}")
    for name, n in (("log_lines", log_lines), ("log_line_bytes", log_line_bytes)):
        if type(n) is not int or n < 0:
            raise ScenarioError(f"{name} must be an integer >= 0, got {n!r}")
