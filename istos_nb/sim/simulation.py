"""Simulation: real Istos apps on a simulated mesh under virtual time, faults from one seed.

Everything runs on a :class:`~istos_nb.sim.vloop.VirtualEventLoop`: the engine's sleeps,
timeouts, sweeps, backoffs, polls and the network's latency all take virtual seconds, and the
clock jumps to the next timer whenever every task waits, so wall time follows the number of
events, not the span of virtual time. Ids, jitter, latencies, losses and random faults all derive
from ``seed``: the same seed and scenario produce byte-identical event tables, in any process.

:class:`Simulation` is the driver: it checks a scenario, schedules it on its
:class:`~istos_nb.sim.world.World` (the nodes, links, clocks, faults, storage and random
streams, which every part of the simulator receives) and runs the loop.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

from istos.core.dedup import is_stored_mark
from istos.core.records import decode_record
from istos.storage.memory import MemoryStorage
from istos.transport.local import LocalMesh

from . import faults
from .errors import ScenarioError
from .logledger import kept_logs
from .network import SimNetwork
from .outbox import SimOutbox
from .progress import auto_progress
from .result import SimResult
from .simnode import SimNode
from .vloop import VirtualEventLoop, VirtualLoopInterrupted
from .vrun import fewer_gc_pauses, run_in_thread
from .workload import Workload
from .world import World

__all__ = ["Simulation", "ScenarioError"]


class Simulation:
    """One simulated deployment: nodes running real Istos apps, a mesh, storage and faults,
    all derived from ``seed``, run once on virtual time (the thin driver over a
    :class:`~istos_nb.sim.world.World`).

    ``storage``: "volatile" (each node's memory: a crashed owner loses its queue) or "durable"
    (one shared store that survives crashes). ``latency_s``: each message's one-way delay,
    drawn uniformly from ``(low, high)``; ``loss``: the probability a message is dropped.
    ``request_timeout_s`` is every node's ``Istos(request_timeout_s=...)``; ``link_lease_s`` how
    long peers keep a frozen node's sessions. Build the scenario (:meth:`node`, faults,
    :meth:`enqueue_jobs`), then :meth:`run` it. Every builder raises :class:`ScenarioError` (a
    ``ValueError``) naming what is impossible: an unknown node, a time in the past or after the
    run's end, an out-of-range option; ``latency_s`` and ``loss`` out of range raise
    :class:`ConfigError` (also a ``ValueError``).
    """

    def __init__(self, seed: int = 0, *, storage: str = "volatile",
                 latency_s: tuple[float, float] = (0.0005, 0.002), loss: float = 0.0,
                 request_timeout_s: float = 2.0, link_lease_s: float = 10.0) -> None:
        if storage not in ("volatile", "durable"):
            raise ScenarioError(f"storage must be 'volatile' or 'durable', got {storage!r}")
        if not link_lease_s > 0:
            raise ScenarioError(f"link_lease_s must be > 0, got {link_lease_s!r}")
        self.world = World(seed, storage=storage, latency_s=latency_s, loss=loss,
                           request_timeout_s=request_timeout_s, link_lease_s=link_lease_s)
        self.workload = Workload(self.world)
        self._random_crashes: list[tuple[list[str], float, float | None, float]] = []
        self._ran = False

    # -- the world's parts, as a scenario reads them --
    @property
    def seed(self) -> int:
        """The seed every random choice of this run derives from; the same seed replays exactly."""
        return self.world.seed

    @property
    def storage_mode(self) -> str:
        """Either "volatile" (each node's own memory) or "durable" (one store for all)."""
        return self.world.storage_mode

    @property
    def request_timeout_s(self) -> float:
        """Every node's ``Istos(request_timeout_s=...)``, in virtual seconds."""
        return self.world.request_timeout_s

    @property
    def link_lease_s(self) -> float:
        """How long peers keep a frozen node's sessions before dropping them (virtual s)."""
        return self.world.link_lease_s

    @property
    def net(self) -> SimNetwork:
        """The simulated network: latency, loss and partitions between the nodes of this run."""
        return self.world.net

    @property
    def mesh(self) -> LocalMesh:
        """The in-process mesh every node's transport is attached to during this run."""
        return self.world.mesh

    @property
    def shared_storage(self) -> MemoryStorage:
        """The one store shared by all nodes (it survives crashes when storage is durable)."""
        return self.world.shared_storage

    @property
    def nodes(self) -> dict[str, SimNode]:
        """The nodes declared so far, by name, in the order they were added to the scenario."""
        return self.world.nodes

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every job event the owners emitted so far, in order: the run's record (read-only)."""
        return self.world.events

    @property
    def outbox(self) -> SimOutbox:
        """The application's database holding an outbox: it outlives every node."""
        return self.world.outbox

    # -- building the scenario --
    def node(self, name: str, *, clock_skew_s: float = 0.0,
             clock_drift_ppm: float = 0.0) -> SimNode:
        """Add node ``name``, booted at virtual time 0; declare its queues and workers on the
        returned :class:`~istos_nb.sim.simnode.SimNode` as on an ``Istos`` app. Its clock reads
        ``clock_skew_s`` ahead and runs ``clock_drift_ppm`` fast (parts per million). Raises
        :class:`ScenarioError` for a name already used or ``|clock_drift_ppm| >= 1e6``."""
        if name in self.nodes:
            raise ScenarioError(f"node {name!r} already exists")
        if abs(clock_drift_ppm) >= 1e6:
            raise ScenarioError(f"clock_drift_ppm must be within +-1e6, got {clock_drift_ppm}")
        node = SimNode(self.world, name, clock_skew_s=clock_skew_s,
                       clock_drift_ppm=clock_drift_ppm)
        self.nodes[name] = node
        return node

    def at(self, t: float, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Call ``fn(*args, **kwargs)`` at virtual time ``t`` (awaited if it is a coroutine),
        inside the context of the node it belongs to when ``fn`` is a node's method. An
        :class:`IstosError` or ``RuntimeError`` the coroutine raises is swallowed (its own
        records say what failed). Raises :class:`ScenarioError` for a time in the past."""
        self.world.at(t, fn, *args, **kwargs)

    def crash(self, node: str, *, at: float, restart_after: float | None = None) -> None:
        """Kill ``node`` at ``at``: memory lost, no ack, no nack; with ``restart_after``, boot
        it again that many seconds later with its declarations. Raises :class:`ScenarioError`
        for an unknown node, a time in the past or a negative ``restart_after``."""
        self.world.node(node)
        if restart_after is not None and restart_after < 0:
            raise ScenarioError(f"restart_after must be >= 0, got {restart_after!r}")
        self.world.schedule(at, f"crash({node!r})",
                            lambda: self.world.crash(node, restart_after))

    def restart(self, node: str, *, at: float) -> None:
        """Crash ``node`` at ``at`` and bring it straight back with its declarations (as
        :meth:`crash` with ``restart_after=0``). Raises :class:`ScenarioError` for an unknown
        node or a time in the past."""
        self.world.node(node)
        self.world.schedule(at, f"restart({node!r})", lambda: self.world.crash(node, 0.0))

    def partition(self, side_a: set[str], side_b: set[str], *, at: float,
                  heal_at: float | None = None) -> None:
        """Cut every link between the nodes of ``side_a`` and those of ``side_b`` at ``at``
        (messages between them are dropped, liveliness tokens across the cut vanish), and heal
        it at ``heal_at`` if given. Raises :class:`ScenarioError` for an unknown node or
        ``heal_at`` before ``at``."""
        for name in (*side_a, *side_b):
            self.world.node(name)
        if heal_at is not None and heal_at < at:
            raise ScenarioError(f"heal_at={heal_at} is before the partition at={at}")
        a, b = set(side_a), set(side_b)
        self.world.schedule(at, "partition", lambda: self.world.partition(a, b, True))
        if heal_at is not None:
            self.world.schedule(heal_at, "heal", lambda: self.world.partition(a, b, False))

    def freeze(self, node: str, *, at: float, resume_at: float | None = None) -> None:
        """Freeze ``node`` at ``at`` as SIGSTOP would: nothing of it runs (its timers and
        incoming messages wait), yet its peers still see its sessions and liveliness tokens
        until ``link_lease_s`` later, when they drop them (as Zenoh's link lease does). At
        ``resume_at`` it carries on where it stopped, late timers first, its clock having
        moved on; its sessions come back if they had been dropped. Raises
        :class:`ScenarioError` for an unknown node or ``resume_at`` before ``at``."""
        self.world.node(node)
        if resume_at is not None and resume_at < at:
            raise ScenarioError(f"resume_at={resume_at} is before the freeze at={at}")
        self.world.freezes = True
        self.world.schedule(at, f"freeze({node!r})", lambda: faults.freeze(self.world, node))
        if resume_at is not None:
            self.world.schedule(resume_at, f"resume({node!r})",
                                lambda: faults.resume(self.world, node))

    def storage_outage(self, *, at: float, until: float) -> None:
        """Make the shared storage refuse every call from ``at`` to ``until``: each raises
        :class:`StorageUnavailable` in the engine, as a real outage would. Raises
        :class:`ScenarioError` unless ``storage="durable"`` and ``until >= at``."""
        if self.storage_mode != "durable":
            raise ScenarioError("storage_outage needs Simulation(storage='durable')")
        if not until >= at:
            raise ScenarioError(f"storage outage ends (until={until}) before it starts ({at})")
        self.world.schedule(at, "storage_outage", lambda: self.world.set_storage(False))
        self.world.schedule(until, "storage_back", lambda: self.world.set_storage(True))

    def network(self, *, latency_s: tuple[float, float] | None = None,
                loss: float | None = None, at: float | None = None) -> None:
        """Change latency and loss now (before the run) or at virtual time ``at``; a value
        left None keeps the current one. Raises :class:`ConfigError` (at once, also for a
        later change) unless ``0 <= low <= high`` and ``0 <= loss < 1``, and
        :class:`ScenarioError` for a time in the past."""
        self.world.lossy = self.world.lossy or bool(loss)
        if at is None:
            self.net.configure(latency_s=latency_s, loss=loss)
            return
        probe = SimNetwork(random.Random(0))
        probe.configure(latency_s=latency_s, loss=loss)  # validate now, not at time ``at``
        self.world.schedule(at, "network",
                            lambda: self.net.configure(latency_s=latency_s, loss=loss))

    def crash_randomly(self, nodes: list[str], *, mtbf_s: float,
                       restart_after: float | None = 5.0, start: float = 0.0) -> None:
        """Crash each of ``nodes`` at exponentially distributed intervals (mean ``mtbf_s``)
        from ``start``, each restarted ``restart_after`` seconds later (None: never). The
        crash times derive from the seed. Raises :class:`ScenarioError` for an unknown node
        or ``mtbf_s <= 0``."""
        for name in nodes:
            self.world.node(name)
        if not mtbf_s > 0:
            raise ScenarioError(f"mtbf_s must be > 0, got {mtbf_s!r}")
        self._random_crashes.append((list(nodes), float(mtbf_s), restart_after, start))

    def lose_acks(self, p: float, *, node: str | None = None) -> None:
        """After a handler's side effect, lose its ack with probability ``p`` (the honest
        source of duplicates: the job comes back when its lease expires). ``node``: only
        that node's workers (None: all). Raises :class:`ScenarioError` for an unknown node or
        ``p`` outside [0, 1]."""
        if node is not None:
            self.world.node(node)
        if not 0.0 <= p <= 1.0:
            raise ScenarioError(f"p must be a probability, got {p!r}")
        self.world.lose_ack[node] = p

    # -- the transactional outbox (outbox.py) --
    def outbox_transactions(self, queue: str, n: int, **kwargs: Any) -> None:
        """``n`` application transactions that each write outbox rows and commit or roll back
        (see ``Workload.outbox_transactions`` for the options). Raises :class:`ScenarioError`
        for a negative ``n``, ``rows`` < 1, a rate <= 0 or ``commit_p`` outside [0, 1]."""
        self.workload.outbox_transactions(queue, n, **kwargs)

    def outbox_outage(self, *, at: float, until: float) -> None:
        """The outbox database refuses every call from ``at`` to ``until`` (relays' and
        writers': a transaction attempted then fails, so it did not commit). Raises
        :class:`ScenarioError` when ``until`` is before ``at`` or a time is in the past."""
        if not until >= at:
            raise ScenarioError(f"outbox outage ends (until={until}) before it starts ({at})")
        self.world.schedule(at, "outbox_outage", lambda: self.outbox.set_available(False))
        self.world.schedule(until, "outbox_back", lambda: self.outbox.set_available(True))

    # -- batches (batches.py) --
    def open_batches(self, node: str, n: int, *, members: dict[str, int], callbacks: str,
                     **kwargs: Any) -> None:
        """``n`` batches opened through ``node``, each with ``members`` (queue -> how many)
        and its three callbacks on queue ``callbacks`` (its home), then closed; ``start``,
        ``every`` (s between batches), ``close``. The checker's batch invariants judge them.
        Raises :class:`ScenarioError` for an unknown node, ``n < 0``, bad counts, or
        volatile storage (a restarted volatile home forgets its batches by design)."""
        if self.storage_mode != "durable":
            raise ScenarioError("open_batches needs Simulation(storage='durable')")
        self.workload.open_batches(node, n, members=members, callbacks=callbacks, **kwargs)

    # -- chords (chord_workload.py) --
    def open_chords(self, node: str, n: int, *, queue: str, size: int, callback: str,
                    **kwargs: Any) -> None:
        """``n`` chords opened through ``node``, each of ``size`` members on ``queue`` with
        its callback on ``callback``; ``cancel`` (its last members cancelled right after the
        open: ``queue`` needs ``admin=True``), ``start``, ``every`` (s between chords). The
        checker's chord invariants judge them. Raises :class:`ScenarioError` for an unknown
        node, ``n < 0``, ``size < 1``, ``cancel`` outside ``[0, size]`` or ``every <= 0``."""
        self.workload.open_chords(node, n, queue=queue, size=size, callback=callback, **kwargs)

    # -- chains (chain_workload.py) --
    def open_chains(self, node: str, n: int, *, queues: list[str], **kwargs: Any) -> None:
        """``n`` chains started through ``node``, each running its steps on ``queues`` in
        order; ``start``, ``every`` (s between chains). The checker's chain invariants judge
        them. Raises :class:`ScenarioError` for an unknown node, ``n < 0``, no queues or
        ``every <= 0``."""
        self.workload.open_chains(node, n, queues=queues, **kwargs)

    # workload helpers (see workload.py)
    def enqueue_jobs(self, node: str, queue: str, n: int, **kwargs: Any) -> None:
        """Enqueue ``n`` jobs on ``queue`` through ``node`` (see
        :meth:`~istos_nb.sim.workload.Workload.enqueue_jobs`: ``rate``, ``poisson``, ``start``,
        ``data``, ``priority``). Each attempt is recorded, also a failed one (the node down, no
        owner). Raises :class:`ScenarioError` for an unknown node, ``n < 0``, ``rate <= 0``
        or ``poisson`` without a rate."""
        self.workload.enqueue_jobs(node, queue, n, **kwargs)

    def enqueue_children(self, node: str, queue: str, n: int, **kwargs: Any) -> None:
        """Enqueue ``n`` jobs on ``queue`` through ``node``, each waiting for parents drawn
        among the jobs already accepted on other queues (see
        :meth:`~istos_nb.sim.workload.Workload.enqueue_children`: ``parents_of``, ``fan_in``,
        ``rate``, ``start``, ``on_parent_failure``). Raises :class:`ScenarioError` for an
        unknown node or a bad option."""
        self.workload.enqueue_children(node, queue, n, **kwargs)

    def handler(self, **kwargs: Any) -> Callable[..., Any]:
        """A worker function for ``@node.worker(...)`` drawing its behaviour from the seed:
        ``service_s`` (a time or a distribution), ``fail_p`` (raise, a nack), ``crash_p`` (the
        delivery dies mid-job), ``effect``, ``log_lines``; see
        :meth:`~istos_nb.sim.workload.Workload.handler`. Raises :class:`ScenarioError` for a
        probability outside [0, 1] or a bad service time."""
        return self.workload.handler(**kwargs)

    # -- running --
    def run(self, until: float, *,
            progress: Callable[[float, float], None] | str | None = "auto") -> SimResult:
        """Run to virtual time ``until`` and return the result. Inside a running event loop (a
        notebook cell) the run happens in a helper thread; Ctrl-C stops it with partial
        results (``result.interrupted``). ``progress``: a ``callback(t, until)``, None, or
        "auto" (a progress bar in a notebook once the run has taken a second). Raises
        :class:`ScenarioError` for ``until <= 0``, a scheduled action after ``until``, a bad
        ``progress``, or a second run (a Simulation runs once)."""
        self._validate_until(until)
        report = _progress(progress)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return self._run(until, report)
        try:
            return run_in_thread(self._run, until, report)
        except KeyboardInterrupt:
            return self._result(until, interrupted=True, wall_s=0.0)

    async def arun(self, until: float, *,
                   progress: Callable[[float, float], None] | str | None = "auto"
                   ) -> SimResult:
        """As :meth:`run`, awaitable: the run happens in a helper thread while the caller's
        loop keeps running."""
        self._validate_until(until)
        report = _progress(progress)
        return await asyncio.to_thread(run_in_thread, self._run, until, report)

    def _validate_until(self, until: float) -> None:
        if self._ran:
            raise ScenarioError("a Simulation runs once; build a new one for another run")
        if not isinstance(until, (int, float)) or not until > 0:
            raise ScenarioError(f"until must be > 0, got {until!r}")
        late = [(t, what) for t, what, _ in self.world.actions if t > until]
        if late:
            t, what = min(late)
            raise ScenarioError(f"until={until} ends before {what} scheduled at t={t}")

    def _run(self, until: float, progress: Callable[[float, float], None] | None) -> SimResult:
        self._ran = True
        started = time.perf_counter()
        world = self.world
        loop = VirtualEventLoop()
        world.loop = loop
        loop.set_task_factory(world.task_factory)
        if world.freezes:
            loop.gate = faults.frozen_parking
        interrupted = False
        try:
            for name in self.nodes:
                loop.call_soon(world.boot, name)
            for t, _what, action in world.actions:
                loop.call_at(t, action)
            self._plan_random_crashes(loop, until)
            if progress is not None:
                self._report_progress(loop, until, progress)
            with fewer_gc_pauses():  # the run's speed, not its events: see vrun.py
                loop.run_until(until)
        except (VirtualLoopInterrupted, KeyboardInterrupt):
            interrupted = True  # stop where we are: the result holds what happened so far
        finally:
            result = self._result(until, interrupted=interrupted,
                                  wall_s=time.perf_counter() - started)
            for node in self.nodes.values():
                if node.incarnation is not None:
                    node.incarnation.app.kill()
            loop.shutdown()
        return result

    def _report_progress(self, loop: VirtualEventLoop, until: float,
                         progress: Callable[[float, float], None]) -> None:
        step = until / 100

        def tick() -> None:
            progress(loop.time(), until)
            if loop.time() + step <= until:
                loop.call_later(step, tick)

        loop.call_later(step, tick)

    def _plan_random_crashes(self, loop: VirtualEventLoop, until: float) -> None:
        for nodes, mtbf, restart_after, start in self._random_crashes:
            for name in nodes:
                t = start
                while True:
                    t += self.world.fault_rng.expovariate(1.0 / mtbf)
                    if t >= until:
                        break
                    loop.call_at(t, self.world.crash, name, restart_after)
                    t += restart_after or 0.0

    def _result(self, until: float, *, interrupted: bool, wall_s: float) -> SimResult:
        world = self.world
        # Held: by an owner that serves (a fenced or frozen one serves nobody).
        serving = [n.incarnation.app for n in self.nodes.values()
                   if n.incarnation is not None and not n.incarnation.frozen]
        held = {r.job_id for app in serving for r in app.held_records() if r.state != "done"}
        queues = {q: c for n in self.nodes.values() for q, c in n.queues.items()}
        stored_records: dict[str, dict[str, bytes]] = {}
        stored: set[str] = set()
        if self.storage_mode == "durable":  # dead letters are set aside, not stranded
            stored_records = {q: self.shared_storage.snapshot(f"jobs:{q}") for q in queues}
            for records in stored_records.values():
                for job_id, raw in records.items():
                    if not is_stored_mark(raw) and decode_record(raw).state != "dead":
                        stored.add(job_id)  # (a dedup mark reserves an id: not a job)
        return SimResult(events=list(world.events), attempts=list(world.attempts),
                         effects=list(world.effects), queues=queues, held=held, stored=stored,
                         volatile=self.storage_mode == "volatile",
                         owner_crashes=list(world.owner_crashes), until=until,
                         heartbeat={(n.name, q) for n in self.nodes.values()
                                    for q in n.heartbeat_queues},
                         lossy=world.lossy, logs=[dict(r, lines=list(r["lines"]))
                                                  for r in world.logs],
                         kept_logs=kept_logs(serving, stored_records),
                         outbox=list(world.outbox.txns),
                         outbox_waiting=world.outbox.waiting(),
                         batches=world.batches.record(),
                         batch_headers=world.batches.headers(self.shared_storage),
                         chords=world.chords.record(), chains=world.chains.record(),
                         virtual_s=world.now(), wall_s=wall_s,
                         interrupted=interrupted, seed=self.seed)


def _progress(
    progress: Callable[[float, float], None] | str | None,
) -> Callable[[float, float], None] | None:
    """The callback ``run(progress=...)`` asks for: "auto" picks one, any other string is wrong."""
    if isinstance(progress, str):
        if progress != "auto":
            raise ScenarioError(f"progress must be a callback(t, until), None or 'auto', "
                                f"got {progress!r}")
        return auto_progress()
    return progress
