"""Simulation: real Istos apps on a simulated mesh under virtual time, faults from one seed.

Everything runs on a :class:`~istos_nb.sim.vloop.VirtualEventLoop`: the engine's sleeps,
timeouts, sweeps, backoffs, polls and the network's latency all take virtual seconds, and the
clock jumps to the next timer whenever every task waits, so wall time follows the number of
events, not the span of virtual time. Ids, jitter, latencies, losses and random faults all derive
from ``seed``: the same seed and scenario produce byte-identical event tables, in any process.
"""

from __future__ import annotations

import asyncio
import contextvars
import random
import time
from collections.abc import Callable
from typing import Any

from istos import events as ev
from istos.core.dedup import is_stored_mark
from istos.core.records import decode_record
from istos.errors import IstosError, StorageUnavailable
from istos.events import JobEvent
from istos.storage.memory import MemoryStorage
from istos.transport.local import LocalMesh

from . import faults
from .logledger import kept_logs, ledger_context
from .network import SimNetwork
from .outbox import SimOutbox
from .progress import auto_progress
from .result import SimResult
from .simnode import Incarnation, SimNode, current_incarnation, instrument
from .vloop import VirtualEventLoop, VirtualLoopInterrupted, run_in_thread
from .vrun import fewer_gc_pauses
from .workload import Workload


class ScenarioError(IstosError, ValueError):
    """A scenario asks for something impossible (unknown node, time in the past...)."""


class Simulation:
    def __init__(self, seed: int = 0, *, storage: str = "volatile",
                 latency_s: tuple[float, float] = (0.0005, 0.002), loss: float = 0.0,
                 request_timeout_s: float = 2.0, link_lease_s: float = 10.0) -> None:
        if storage not in ("volatile", "durable"):
            raise ScenarioError(f"storage must be 'volatile' or 'durable', got {storage!r}")
        if not link_lease_s > 0:
            raise ScenarioError(f"link_lease_s must be > 0, got {link_lease_s!r}")
        self.seed = seed
        self.link_lease_s = float(link_lease_s)
        self._freezes = False
        self.storage_mode = storage
        self.request_timeout_s = request_timeout_s
        self.net = SimNetwork(random.Random(f"{seed}:network"), latency_s, loss)
        self.mesh = LocalMesh(self.net)
        self.shared_storage = MemoryStorage(durable=True, shared=True)
        self.nodes: dict[str, SimNode] = {}
        self.workload = Workload(self, random.Random(f"{seed}:workload"))
        self._fault_rng = random.Random(f"{seed}:faults")
        self._actions: list[tuple[float, str, Callable[[], Any]]] = []
        self._random_crashes: list[tuple[list[str], float, float | None, float]] = []
        self._lose_ack: dict[str | None, float] = {}
        self._lossy = loss > 0  # the heartbeat invariant holds only on a lossless network
        self._loop: VirtualEventLoop | None = None
        self._ran = False
        # what the run records
        self.events: list[dict[str, Any]] = []
        self.attempts: list[dict[str, Any]] = []
        self.effects: list[dict[str, Any]] = []
        self.owner_crashes: list[tuple[float, str]] = []
        self.logs: list[dict[str, Any]] = []  # the job-log ledger: what handlers wrote
        self.outbox = SimOutbox(self)  # the application's database (outlives every node)

    # -- building the scenario --
    def node(self, name: str, *, clock_skew_s: float = 0.0,
             clock_drift_ppm: float = 0.0) -> SimNode:
        if name in self.nodes:
            raise ScenarioError(f"node {name!r} already exists")
        if abs(clock_drift_ppm) >= 1e6:
            raise ScenarioError(f"clock_drift_ppm must be within +-1e6, got {clock_drift_ppm}")
        node = SimNode(self, name, clock_skew_s=clock_skew_s, clock_drift_ppm=clock_drift_ppm)
        self.nodes[name] = node
        return node

    def _node(self, name: str) -> SimNode:
        node = self.nodes.get(name)
        if node is None:
            raise ScenarioError(f"unknown node {name!r}; nodes: {sorted(self.nodes)}")
        return node

    def _schedule(self, t: float, what: str, action: Callable[[], Any]) -> None:
        if not isinstance(t, (int, float)) or t != t or t < 0:
            raise ScenarioError(f"{what}: time must be a number >= 0, got {t!r}")
        now = self._loop.time() if self._loop is not None else 0.0
        if t < now:
            raise ScenarioError(f"{what}: t={t} is in the past (virtual time is {now})")
        self._actions.append((float(t), what, action))
        if self._loop is not None:
            self._loop.call_at(float(t), action)

    def at(self, t: float, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Call ``fn(*args, **kwargs)`` at virtual time ``t`` (awaited if it is a coroutine),
        inside the context of the node it belongs to when ``fn`` is a node's method."""
        owner = getattr(fn, "__self__", None)
        node = owner if isinstance(owner, SimNode) else None

        def fire() -> None:
            result = fn(*args, **kwargs)
            if asyncio.iscoroutine(result):
                self._spawn(node, self._quietly(result))

        self._schedule(t, f"at({getattr(fn, '__name__', fn)!r})", fire)

    def crash(self, node: str, *, at: float, restart_after: float | None = None) -> None:
        """Kill ``node`` at ``at``: memory lost, no ack, no nack; restart after a pause."""
        self._node(node)
        if restart_after is not None and restart_after < 0:
            raise ScenarioError(f"restart_after must be >= 0, got {restart_after!r}")
        self._schedule(at, f"crash({node!r})", lambda: self._crash(node, restart_after))

    def restart(self, node: str, *, at: float) -> None:
        """Crash ``node`` and bring it straight back with its declarations."""
        self._node(node)
        self._schedule(at, f"restart({node!r})", lambda: self._crash(node, 0.0))

    def partition(self, side_a: set[str], side_b: set[str], *, at: float,
                  heal_at: float | None = None) -> None:
        for name in (*side_a, *side_b):
            self._node(name)
        if heal_at is not None and heal_at < at:
            raise ScenarioError(f"heal_at={heal_at} is before the partition at={at}")
        a, b = set(side_a), set(side_b)
        self._schedule(at, "partition", lambda: self._partition(a, b, True))
        if heal_at is not None:
            self._schedule(heal_at, "heal", lambda: self._partition(a, b, False))

    def freeze(self, node: str, *, at: float, resume_at: float | None = None) -> None:
        """Freeze ``node`` at ``at`` as SIGSTOP would: nothing of it runs (its timers and
        incoming messages wait), yet its peers still see its sessions and liveliness tokens
        until ``link_lease_s`` later, when they drop them (as Zenoh's link lease does). At
        ``resume_at`` it carries on where it stopped, late timers first, its clock having
        moved on; its sessions come back if they had been dropped."""
        self._node(node)
        if resume_at is not None and resume_at < at:
            raise ScenarioError(f"resume_at={resume_at} is before the freeze at={at}")
        self._freezes = True
        self._schedule(at, f"freeze({node!r})", lambda: faults.freeze(self, node))
        if resume_at is not None:
            self._schedule(resume_at, f"resume({node!r})", lambda: faults.resume(self, node))

    def storage_outage(self, *, at: float, until: float) -> None:
        """Make the shared storage refuse every call from ``at`` to ``until`` (durable only)."""
        if self.storage_mode != "durable":
            raise ScenarioError("storage_outage needs Simulation(storage='durable')")
        if not until >= at:
            raise ScenarioError(f"storage outage ends (until={until}) before it starts ({at})")
        self._schedule(at, "storage_outage", lambda: self._storage(False))
        self._schedule(until, "storage_back", lambda: self._storage(True))

    def network(self, *, latency_s: tuple[float, float] | None = None,
                loss: float | None = None, at: float | None = None) -> None:
        """Change latency and loss now (before the run) or at virtual time ``at``."""
        self._lossy = self._lossy or bool(loss)
        if at is None:
            self.net.configure(latency_s=latency_s, loss=loss)
            return
        probe = SimNetwork(random.Random(0))
        probe.configure(latency_s=latency_s, loss=loss)  # validate now, not at time ``at``
        self._schedule(at, "network", lambda: self.net.configure(latency_s=latency_s, loss=loss))

    def crash_randomly(self, nodes: list[str], *, mtbf_s: float,
                       restart_after: float | None = 5.0, start: float = 0.0) -> None:
        """Crash each of ``nodes`` at exponentially distributed intervals (mean ``mtbf_s``)."""
        for name in nodes:
            self._node(name)
        if not mtbf_s > 0:
            raise ScenarioError(f"mtbf_s must be > 0, got {mtbf_s!r}")
        self._random_crashes.append((list(nodes), float(mtbf_s), restart_after, start))

    def lose_acks(self, p: float, *, node: str | None = None) -> None:
        """After a handler's side effect, lose its ack with probability ``p`` (the honest
        source of duplicates: the job comes back when its lease expires)."""
        if node is not None:
            self._node(node)
        if not 0.0 <= p <= 1.0:
            raise ScenarioError(f"p must be a probability, got {p!r}")
        self._lose_ack[node] = p

    # -- the transactional outbox (outbox.py) --
    def outbox_transactions(self, queue: str, n: int, **kwargs: Any) -> None:
        """``n`` application transactions that each write outbox rows (``workload.py``)."""
        self.workload.outbox_transactions(queue, n, **kwargs)

    def outbox_outage(self, *, at: float, until: float) -> None:
        """The outbox database refuses every call from ``at`` to ``until`` (relays' and
        writers': a transaction attempted then fails, so it did not commit)."""
        if not until >= at:
            raise ScenarioError(f"outbox outage ends (until={until}) before it starts ({at})")
        self._schedule(at, "outbox_outage", lambda: self.outbox.set_available(False))
        self._schedule(until, "outbox_back", lambda: self.outbox.set_available(True))

    # workload helpers (see workload.py)
    def enqueue_jobs(self, node: str, queue: str, n: int, **kwargs: Any) -> None:
        self.workload.enqueue_jobs(node, queue, n, **kwargs)

    def handler(self, **kwargs: Any) -> Callable[..., Any]:
        return self.workload.handler(**kwargs)

    # -- running --
    def run(self, until: float, *,
            progress: Callable[[float, float], None] | str | None = "auto") -> SimResult:
        """Run to virtual time ``until`` and return the result. Inside a running event loop (a
        notebook cell) the run happens in a helper thread; Ctrl-C stops it with partial
        results (``result.interrupted``). ``progress``: a ``callback(t, until)``, None, or
        "auto" (a progress bar in a notebook once the run has taken a second)."""
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
        self._validate_until(until)
        report = _progress(progress)
        return await asyncio.to_thread(run_in_thread, self._run, until, report)

    def _validate_until(self, until: float) -> None:
        if self._ran:
            raise ScenarioError("a Simulation runs once; build a new one for another run")
        if not isinstance(until, (int, float)) or not until > 0:
            raise ScenarioError(f"until must be > 0, got {until!r}")
        late = [(t, what) for t, what, _ in self._actions if t > until]
        if late:
            t, what = min(late)
            raise ScenarioError(f"until={until} ends before {what} scheduled at t={t}")

    def _run(self, until: float, progress: Callable[[float, float], None] | None) -> SimResult:
        self._ran = True
        started = time.perf_counter()
        loop = VirtualEventLoop()
        self._loop = loop
        loop.set_task_factory(self._task_factory)
        if self._freezes:
            loop.gate = faults.frozen_parking
        interrupted = False
        try:
            for name in self.nodes:
                loop.call_soon(self._boot, name)
            for t, _what, action in self._actions:
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
                    t += self._fault_rng.expovariate(1.0 / mtbf)
                    if t >= until:
                        break
                    loop.call_at(t, self._crash, name, restart_after)
                    t += restart_after or 0.0

    def _result(self, until: float, *, interrupted: bool, wall_s: float) -> SimResult:
        # Held: by an owner that serves (a fenced or frozen one serves nobody).
        held: set[str] = set()
        for node in self.nodes.values():
            life = node.incarnation
            if life is not None and not life.frozen:
                for owner in life.app.owners.values():
                    if owner.running:
                        held.update(j for j, r in owner.state.jobs.items()
                                    if r.state != "done")
        queues = {q: c for n in self.nodes.values() for q, c in n.queues.items()}
        stored: set[str] = set()
        if self.storage_mode == "durable":  # dead letters are set aside, not stranded
            for q in queues:
                for job_id, raw in self.shared_storage._data.get(f"jobs:{q}", {}).items():
                    if not is_stored_mark(raw) and decode_record(raw).state != "dead":
                        stored.add(job_id)  # (a dedup mark reserves an id: not a job)
        return SimResult(events=list(self.events), attempts=list(self.attempts),
                         effects=list(self.effects), queues=queues, held=held, stored=stored,
                         volatile=self.storage_mode == "volatile",
                         owner_crashes=list(self.owner_crashes), until=until,
                         heartbeat={(n.name, q) for n in self.nodes.values()
                                    for q in n.heartbeat_queues},
                         lossy=self._lossy, logs=[dict(r, lines=list(r["lines"]))
                                                  for r in self.logs],
                         kept_logs=kept_logs(self), outbox=list(self.outbox.txns),
                         outbox_waiting=self.outbox.waiting(),
                         virtual_s=self._loop.time() if self._loop else 0.0,
                         wall_s=wall_s, interrupted=interrupted, seed=self.seed)

    # -- the node lifecycle --
    def _task_factory(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        context = kwargs.get("context")
        life = context.get(current_incarnation) if context is not None \
            else current_incarnation.get()
        if life is not None:
            life.tasks.add(task)
        return task

    def _spawn(self, node: SimNode | None, coro: Any) -> None:
        assert self._loop is not None
        life = node.incarnation if node is not None else None
        if life is not None and life.context is not None:
            life.context.run(self._loop.create_task, coro)
        else:
            self._loop.create_task(coro)

    def _boot(self, name: str) -> None:
        node = self.nodes[name]
        assert self._loop is not None
        life = node.build(self._loop)
        context = contextvars.copy_context()
        context.run(current_incarnation.set, life)
        life.context = context
        node.incarnation = life

        def record(event: JobEvent) -> None:
            self._record(event.to_dict(), event.t)

        life.app.events.subscribe(record)
        context.run(self._loop.create_task, self._start_app(node, life))

    async def _start_app(self, node: SimNode, life: Incarnation) -> None:
        try:
            await life.app.start()
        except StorageUnavailable as exc:
            # As a supervisor would: a node that cannot reach its storage at start-up exits
            # and is started again a second later.
            self._node_event(node.name, "boot_failed", error=repr(exc))
            assert self._loop is not None
            self._loop.call_soon(self._crash, node.name, 1.0)
        except Exception as exc:  # a scenario bug must surface, not hang
            self._node_event(node.name, "boot_failed", error=repr(exc))
            raise

    def _crash(self, name: str, restart_after: float | None) -> None:
        node = self.nodes[name]
        life = node.incarnation
        if life is None:
            return
        assert self._loop is not None
        self._node_event(name, ev.CRASHED)
        if life.app.queues:
            self.owner_crashes.append((self._loop.time(), name))
        node.incarnation = None
        life.frozen, life.parked = False, []  # a frozen process can be killed too
        if life.link_cut:
            faults.cut_links(self, name, False)
        life.app.kill()
        # In creation order (a WeakSet iterates by address, which would vary between runs).
        for task in self._loop.pending_tasks():
            if task in life.tasks:
                task.cancel()
        if restart_after is not None:
            self._loop.call_later(restart_after, self._restart, name)

    def _restart(self, name: str) -> None:
        if self.nodes[name].incarnation is None:
            self._node_event(name, ev.RESTARTED)
            self._boot(name)

    def _storage(self, available: bool) -> None:
        self.shared_storage.available = available
        self._node_event("storage", "storage_up" if available else "storage_down")

    def _partition(self, a: set[str], b: set[str], cut: bool) -> None:
        (self.net.partition if cut else self.net.heal)(a, b)
        self.mesh.refresh_liveliness()
        self._node_event(",".join(sorted(a)), "partitioned" if cut else "healed",
                         other=",".join(sorted(b)))

    # -- recording --
    def _record(self, row: dict[str, Any], t_node: float) -> None:
        assert self._loop is not None
        row["t_node"] = t_node
        row["t"] = self._loop.time()
        self.events.append(row)

    def _node_event(self, node: str, kind: str, job_id: str = "", **detail: Any) -> None:
        assert self._loop is not None
        now = self._loop.time()
        self.events.append({"t": now, "t_node": now, "node": node, "queue": "",
                            "job_id": job_id, "kind": kind, "attempt": 0, "worker": None,
                            "detail": detail})

    def _instrument(self, node: SimNode, queue: str, fn: Callable[..., Any]) -> Any:
        def on_done(ctx: Any) -> bool:
            assert self._loop is not None
            self.effects.append({"job_id": ctx.job_id, "queue": queue, "node": node.name,
                                 "attempt": ctx.attempt, "t": self._loop.time()})
            p = self._lose_ack.get(node.name, self._lose_ack.get(None, 0.0))
            if p and self._fault_rng.random() < p:
                self._node_event(node.name, "ack_lost", job_id=ctx.job_id)
                return True
            return False

        def on_start(ctx: Any) -> Any:
            assert self._loop is not None
            return ledger_context(ctx, self.logs, node.name, self._loop.time())

        return instrument(fn, on_done, on_start)

    async def _enqueue_via(self, node: SimNode, queue: str, data: Any,
                           **kwargs: Any) -> str | None:
        assert self._loop is not None
        row: dict[str, Any] = {"job_id": None, "queue": queue, "node": node.name,
                               "t": self._loop.time(), "status": "failed", "error": None}
        self.attempts.append(row)
        if node.incarnation is None:
            row["error"] = "node down"
            return None
        app = node.incarnation.app
        job_id = kwargs.pop("job_id", None) or app.node.ids.new()
        row["job_id"] = job_id
        try:
            await app.enqueue(queue, data, job_id=job_id, **kwargs)
        except IstosError as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
            return None
        row["status"] = "ok"
        return job_id

    @staticmethod
    async def _quietly(coro: Any) -> None:
        try:
            await coro
        except (IstosError, RuntimeError):
            pass  # recorded by whoever failed (e.g. the enqueue attempt row)


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
