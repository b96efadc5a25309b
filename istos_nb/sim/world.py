"""The World of a simulation: everything a run is made of, in one object its parts receive.

A :class:`World` holds the nodes (each with its clock, see ``simnode.py``), the links between
them (the :class:`~istos_nb.sim.network.SimNetwork` model and the in-process mesh over it), the
shared storage, the seeded random streams, the faults in force, the virtual loop once the run
has started, and what the run records (events, enqueue attempts, side effects, the job-log
ledger). Faults that change it are its methods (crash, restart, partition, storage outage);
freezing is in ``faults.py``, the workload in ``workload.py``, both given the World. The
:class:`~istos_nb.sim.simulation.Simulation` is a thin driver: it validates a scenario,
schedules it on the World and runs the loop (turmoil, tokio's network simulator, splits its
``Sim`` and ``World`` the same way).

The World reaches the engine only through public surfaces: an app's event stream, its calls
(``start``, ``enqueue``, ``kill``), ``Istos.held_records`` and ``MemoryStorage.snapshot``.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import random
from collections.abc import Callable
from typing import Any

from istos import events as ev
from istos.errors import IstosError, StorageUnavailable
from istos.events import JobEvent
from istos.storage.memory import MemoryStorage
from istos.transport.local import LocalMesh, LocalTransport

from .batch_workload import SimBatches
from .chain_workload import SimChains
from .chord_workload import SimChords
from .errors import ScenarioError
from .logledger import ledger_context
from .network import SimNetwork
from .outbox import SimOutbox
from .simnode import Incarnation, SimNode, current_incarnation, instrument
from .vloop import VirtualEventLoop

__all__ = ["World"]

Action = tuple[float, str, Callable[[], Any]]


class World:
    """The state of one simulation; see the module docstring. Built by ``Simulation``."""

    def __init__(self, seed: int, *, storage: str, latency_s: tuple[float, float],
                 loss: float, request_timeout_s: float, link_lease_s: float) -> None:
        self.seed = seed
        self.storage_mode = storage
        self.request_timeout_s = request_timeout_s
        self.link_lease_s = float(link_lease_s)
        self.net = SimNetwork(random.Random(f"{seed}:network"), latency_s, loss)  # the links
        self.mesh = LocalMesh(self.net)
        self.shared_storage = MemoryStorage(durable=True, shared=True)
        self.nodes: dict[str, SimNode] = {}
        self.workload_rng = random.Random(f"{seed}:workload")
        self.fault_rng = random.Random(f"{seed}:faults")
        self.lose_ack: dict[str | None, float] = {}  # node (None: any) -> p of losing an ack
        self.lossy = loss > 0  # the heartbeat invariant holds only on a lossless network
        self.freezes = False  # a scenario that freezes needs the loop's gate
        self.loop: VirtualEventLoop | None = None
        self.actions: list[Action] = []  # what the scenario scheduled, in call order
        # what the run records
        self.events: list[dict[str, Any]] = []
        self.attempts: list[dict[str, Any]] = []
        self.effects: list[dict[str, Any]] = []
        self.owner_crashes: list[tuple[float, str]] = []
        self.logs: list[dict[str, Any]] = []  # the job-log ledger: what handlers wrote
        self.outbox = SimOutbox(self)  # the application's database (outlives every node)
        self.batches = SimBatches(self)  # the batches the workload opened (batches.py)
        self.chords = SimChords(self)  # the chords the workload opened (chord_workload.py)
        self.chains = SimChains(self)  # the chains the workload started (chain_workload.py)

    # -- what the parts ask of it ----------------------------------------------------------
    def now(self) -> float:
        """Virtual time (0.0 before the run starts)."""
        return self.loop.time() if self.loop is not None else 0.0

    def node(self, name: str) -> SimNode:
        """The node called ``name``; raises ScenarioError when there is none."""
        node = self.nodes.get(name)
        if node is None:
            raise ScenarioError(f"unknown node {name!r}; nodes: {sorted(self.nodes)}")
        return node

    def storage_for(self) -> MemoryStorage:
        """A (re)starting node's storage: the shared one if durable, else a fresh memory."""
        return self.shared_storage if self.storage_mode == "durable" else MemoryStorage()

    def transport(self, name: str) -> LocalTransport:
        return self.mesh.transport(name)

    def schedule(self, t: float, what: str, action: Callable[[], Any]) -> None:
        """Run ``action`` at virtual time ``t``; raises ScenarioError for a bad or past ``t``."""
        if not isinstance(t, (int, float)) or t != t or t < 0:
            raise ScenarioError(f"{what}: time must be a number >= 0, got {t!r}")
        now = self.now()
        if t < now:
            raise ScenarioError(f"{what}: t={t} is in the past (virtual time is {now})")
        self.actions.append((float(t), what, action))
        if self.loop is not None:
            self.loop.call_at(float(t), action)

    def at(self, t: float, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Call ``fn(*args, **kwargs)`` at ``t`` (awaited if it is a coroutine), inside the
        context of the node it belongs to when ``fn`` is a node's method."""
        owner = getattr(fn, "__self__", None)
        node = owner if isinstance(owner, SimNode) else None

        def fire() -> None:
            if inspect.iscoroutinefunction(fn):
                # The coroutine is made when its task first runs: a node that crashes first
                # cancels a task that never made one (no "never awaited" coroutine left).
                self.spawn(node, _call_quietly(fn, args, kwargs))
                return
            result = fn(*args, **kwargs)
            if asyncio.iscoroutine(result):
                self.spawn(node, _quietly(result))

        self.schedule(t, f"at({getattr(fn, '__name__', fn)!r})", fire)

    def spawn(self, node: SimNode | None, coro: Any) -> None:
        """Run ``coro`` as a task of ``node``'s current life (dies with it), or of nobody."""
        assert self.loop is not None
        life = node.incarnation if node is not None else None
        if life is not None and life.context is not None:
            life.context.run(self.loop.create_task, coro)
        else:
            self.loop.create_task(coro)

    # -- recording ---------------------------------------------------------------------------
    def record(self, row: dict[str, Any], t_node: float) -> None:
        """An engine event (``JobEvent.to_dict()``) at the true time, with the node's own."""
        row["t_node"] = t_node
        row["t"] = self.now()
        self.events.append(row)

    def node_event(self, node: str, kind: str, job_id: str = "", **detail: Any) -> None:
        """An event of the world itself (a crash, a partition, a lost ack...)."""
        now = self.now()
        self.events.append({"t": now, "t_node": now, "node": node, "queue": "",
                            "job_id": job_id, "kind": kind, "attempt": 0, "worker": None,
                            "detail": detail})

    def instrument(self, node: SimNode, queue: str, fn: Callable[..., Any]) -> Any:
        """``fn`` wrapped for ``node``'s worker of ``queue``: its side effects are recorded,
        its log lines go to the ledger, and its ack may be lost (``lose_ack``)."""
        def on_done(ctx: Any) -> bool:
            self.effects.append({"job_id": ctx.job_id, "queue": queue, "node": node.name,
                                 "attempt": ctx.attempt, "t": self.now()})
            p = self.lose_ack.get(node.name, self.lose_ack.get(None, 0.0))
            if p and self.fault_rng.random() < p:
                self.node_event(node.name, "ack_lost", job_id=ctx.job_id)
                return True
            return False

        def on_start(ctx: Any) -> Any:
            return ledger_context(ctx, self.logs, node.name, self.now())

        return instrument(fn, on_done, on_start)

    async def enqueue_via(self, node: SimNode, queue: str, data: Any,
                          **kwargs: Any) -> str | None:
        """Enqueue through ``node``'s app, recorded as an attempt whatever the outcome."""
        row: dict[str, Any] = {"job_id": None, "queue": queue, "node": node.name,
                               "t": self.now(), "status": "failed", "error": None}
        if "after" in kwargs:  # a child: the checker needs its parents and mode (checker_deps)
            row["after"] = [list(ref) for ref in kwargs["after"]]
            row["mode"] = kwargs.get("on_parent_failure", "cancel")
        self.attempts.append(row)
        if node.incarnation is None:
            row["error"] = "node down"
            return None
        app = node.incarnation.app
        job_id = kwargs.pop("job_id", None) or app.node.ids.new()
        row["job_id"] = job_id
        try:
            got = await app.enqueue(queue, data, job_id=job_id, **kwargs)
        except IstosError as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
            return None
        row["status"] = "ok"
        # A unique or debounce key may resolve to another job: that job is the one accepted.
        row["job_id"] = job_id = str(got)
        return job_id

    def accepted_on(self, queues: tuple[str, ...]) -> list[tuple[str, str]]:
        """(queue, job id) of every enqueue accepted so far on ``queues``, in order."""
        return [(a["queue"], a["job_id"]) for a in self.attempts
                if a["status"] == "ok" and a["queue"] in queues and a["job_id"]]

    def draw(self, population: list[tuple[str, str]], k: int) -> list[tuple[str, str]]:
        """``k`` of ``population``, drawn with the workload rng (the seed decides)."""
        return self.workload_rng.sample(population, k)

    # -- the nodes' lives --------------------------------------------------------------------
    def task_factory(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        """The loop's task factory: a task belongs to the life it was created in."""
        task = asyncio.Task(coro, loop=loop, **kwargs)
        context = kwargs.get("context")
        life = context.get(current_incarnation) if context is not None \
            else current_incarnation.get()
        if life is not None:
            life.tasks.add(task)
        return task

    def boot(self, name: str) -> None:
        """Start a new life of ``name``: a fresh app from its declarations, recorded."""
        node = self.nodes[name]
        assert self.loop is not None
        life = node.build(self.loop)
        context = contextvars.copy_context()
        context.run(current_incarnation.set, life)
        life.context = context
        node.incarnation = life

        def record(event: JobEvent) -> None:
            self.record(event.to_dict(), event.t)

        life.app.events.subscribe(record)
        context.run(self.loop.create_task, self._start_app(node, life))

    async def _start_app(self, node: SimNode, life: Incarnation) -> None:
        try:
            await life.app.start()
        except StorageUnavailable as exc:
            # As a supervisor would: a node that cannot reach its storage at start-up exits
            # and is started again a second later.
            self.node_event(node.name, "boot_failed", error=repr(exc))
            assert self.loop is not None
            self.loop.call_soon(self.crash, node.name, 1.0)
        except Exception as exc:  # a scenario bug must surface, not hang
            self.node_event(node.name, "boot_failed", error=repr(exc))
            raise

    # -- faults ------------------------------------------------------------------------------
    def crash(self, name: str, restart_after: float | None) -> None:
        """Kill ``name`` now (memory lost, no ack, no nack); back after ``restart_after``."""
        node = self.nodes[name]
        life = node.incarnation
        if life is None:
            return
        assert self.loop is not None
        self.node_event(name, ev.CRASHED)
        if node.queues:  # an owner node (it declares queues)
            self.owner_crashes.append((self.loop.time(), name))
        node.incarnation = None
        life.frozen, life.parked = False, []  # a frozen process can be killed too
        if life.link_cut:
            self.cut_links(name, False)
        life.app.kill()
        # In creation order (a WeakSet iterates by address, which would vary between runs).
        for task in self.loop.pending_tasks():
            if task in life.tasks:
                task.cancel()
        if restart_after is not None:
            self.loop.call_later(restart_after, self.restart, name)

    def restart(self, name: str) -> None:
        """Boot ``name`` again if it is down."""
        if self.nodes[name].incarnation is None:
            self.node_event(name, ev.RESTARTED)
            self.boot(name)

    def set_storage(self, available: bool) -> None:
        """Start or end a storage outage (the shared storage refuses every call)."""
        self.shared_storage.available = available
        self.node_event("storage", "storage_up" if available else "storage_down")

    def partition(self, a: set[str], b: set[str], cut: bool) -> None:
        """Cut (or heal) every link between ``a`` and ``b``, and tell the watchers."""
        (self.net.partition if cut else self.net.heal)(a, b)
        self.mesh.refresh_liveliness()
        self.node_event(",".join(sorted(a)), "partitioned" if cut else "healed",
                        other=",".join(sorted(b)))

    def cut_links(self, name: str, cut: bool) -> None:
        """Partition ``name`` from every other node (or heal that), and tell the watchers."""
        others = set(self.nodes) - {name}
        (self.net.partition if cut else self.net.heal)({name}, others)
        self.mesh.refresh_liveliness()


async def _call_quietly(fn: Callable[..., Any], args: tuple[Any, ...],
                        kwargs: dict[str, Any]) -> None:
    await _quietly(fn(*args, **kwargs))


async def _quietly(coro: Any) -> None:
    try:
        await coro
    except (IstosError, RuntimeError):
        pass  # recorded by whoever failed (e.g. the enqueue attempt row)
