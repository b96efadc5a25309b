"""A simulated node: the user's declarations, replayed onto a real ``Istos`` at every (re)start."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import random
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from istos import Istos
from istos.core.config import QueueConfig
from istos.errors import HAConfigError
from istos.node import run_inline
from istos.storage.memory import MemoryStorage
from istos.transport.local import LocalTransport

from .clock import SimClock

current_incarnation: contextvars.ContextVar[Incarnation | None] = contextvars.ContextVar(
    "istos_sim_incarnation", default=None)


@dataclass(eq=False)
class Incarnation:
    """One life of a node, from (re)start to crash: its app and every task it spawned."""

    number: int
    app: Istos
    # weak: the loop keeps pending tasks alive; we only need them to cancel them on a crash
    tasks: weakref.WeakSet[asyncio.Task[Any]] = field(default_factory=weakref.WeakSet)
    context: contextvars.Context | None = None
    frozen: bool = False  # SIGSTOP-like: its callbacks are parked until it resumes
    parked: list[tuple[Any, tuple[Any, ...], contextvars.Context]] = field(default_factory=list)
    link_cut: bool = False  # frozen past the link lease: peers have dropped its sessions

if TYPE_CHECKING:
    from .outbox import SimOutbox


class NodeWorld(Protocol):
    """What a node asks of the world it lives in (:class:`~istos_nb.sim.world.World`)."""

    seed: int
    storage_mode: str
    request_timeout_s: float

    @property
    def outbox(self) -> SimOutbox: ...

    def storage_for(self) -> MemoryStorage: ...

    def transport(self, name: str) -> LocalTransport: ...

    def instrument(self, node: SimNode, queue: str, fn: Callable[..., Any]) -> Any: ...

    async def enqueue_via(self, node: SimNode, queue: str, data: Any,
                          **kwargs: Any) -> str | None: ...

    def accepted_on(self, queues: tuple[str, ...]) -> list[tuple[str, str]]: ...

    def draw(self, population: list[tuple[str, str]], k: int) -> list[tuple[str, str]]: ...


class SimNode:
    """Declare queues, workers, schedules and subscriptions exactly as on ``Istos``.

    The declarations are recorded and applied to a fresh ``Istos`` each time the node starts,
    so a restarted node comes back with them, and with nothing else from its previous life.
    """

    def __init__(self, world: NodeWorld, name: str, *, clock_skew_s: float = 0.0,
                 clock_drift_ppm: float = 0.0) -> None:
        self.world = world
        self.name = name
        self.clock_skew_s = float(clock_skew_s)
        self.clock_drift_ppm = float(clock_drift_ppm)
        self.queues: dict[str, QueueConfig] = {}
        self.heartbeat_queues: set[str] = set()
        self._declarations: list[Callable[[Istos], object]] = []  # results are ignored
        self.incarnation: Incarnation | None = None
        self._lives = 0
        self.clock: SimClock | None = None

    @property
    def alive(self) -> bool:
        return self.incarnation is not None

    @property
    def app(self) -> Istos:
        if self.incarnation is None:
            raise RuntimeError(f"node {self.name!r} is down")
        return self.incarnation.app

    # -- declarations (validated now, applied at every start) ------------------------------------
    def queue(self, name: str, **options: Any) -> QueueConfig:
        config = QueueConfig.build(name, **options)
        if config.ha and self.world.storage_mode != "durable":
            raise HAConfigError(f"queue {name!r}: ha=True needs Simulation(storage='durable') "
                                "so replicas share their storage")
        self.queues[name] = config
        self._declarations.append(lambda app: app.queue(name, **options))
        return config

    def worker(self, name: str, **options: Any) -> Callable[[Any], Any]:
        if options.get("heartbeat") is True:
            self.heartbeat_queues.add(name)  # for the checker's heartbeat invariant

        def register(fn: Any) -> Any:
            wrapped = self.world.instrument(self, name, fn)
            self._declarations.append(lambda app: app.worker(name, **options)(wrapped))
            return fn

        return register

    def schedule(self, queue: str, data: Any, **options: Any) -> None:
        self._declarations.append(lambda app: app.schedule(queue, data, **options))

    def subscribe(self, key: str, **options: Any) -> Callable[[Any], Any]:
        def register(fn: Any) -> Any:
            self._declarations.append(lambda app: app.subscribe(key, **options)(fn))
            return fn

        return register

    def outbox_relay(self, queues: list[str] | None = None, **options: Any) -> None:
        """Run an outbox relay on this node over the simulation's outbox database
        (``sim.outbox.db``), from every (re)start: ``Istos.outbox_relay``'s options."""
        self._declarations.append(
            lambda app: app.outbox_relay(self.world.outbox.db, queues=queues, **options))

    # -- calls a scenario makes on the node --
    async def enqueue(self, queue: str, data: Any, **kwargs: Any) -> str | None:
        """Enqueue through this node; recorded for the checker whatever the outcome."""
        return await self.world.enqueue_via(self, queue, data, **kwargs)

    async def enqueue_after(self, queue: str, data: Any, *, parents_of: tuple[str, ...],
                            fan_in: int = 2, **kwargs: Any) -> str | None:
        """Enqueue a child waiting for up to ``fan_in`` parents drawn (workload rng) among the
        jobs already accepted on the queues ``parents_of``; recorded as :meth:`enqueue` is,
        with its parents. Without any accepted job there yet, nothing is sent."""
        accepted = self.world.accepted_on(parents_of)
        if not accepted:
            return None
        parents = self.world.draw(accepted, min(fan_in, len(accepted)))
        return await self.world.enqueue_via(self, queue, data, after=parents, **kwargs)

    async def publish(self, key: str, data: Any, **kwargs: Any) -> Any:
        return await self.app.publish(key, data, **kwargs)

    async def result(self, queue: str, job_id: str) -> dict[str, Any]:
        return await self.app.result(queue, job_id)

    async def dead_letters(self, queue: str) -> list[dict[str, Any]]:
        return await self.app.dead_letters(queue)

    def __getattr__(self, attr: str) -> Any:
        # chain / group / chord / requeue_dead and the other calls of the node's live app.
        # Methods bind late, to whichever incarnation is alive when they are called, so
        # ``sim.at(t, node.chain, ...)`` works before the run starts and across restarts.
        if attr.startswith("_") or not hasattr(Istos, attr):
            raise AttributeError(attr)
        if callable(getattr(Istos, attr)):
            return _LateBound(self, attr)
        return getattr(self.app, attr)

    # -- life and death --
    def build(self, loop: asyncio.AbstractEventLoop) -> Incarnation:
        self._lives += 1
        self.clock = SimClock(loop, skew_s=self.clock_skew_s, drift_ppm=self.clock_drift_ppm)
        world = self.world
        app = Istos(storage=world.storage_for(), transport=world.transport(self.name),
                    clock=self.clock, rng=random.Random(f"{world.seed}:{self.name}:{self._lives}"),
                    node_id=self.name, run_sync=run_inline,
                    request_timeout_s=world.request_timeout_s, shutdown_grace_s=0.0)
        for declare in self._declarations:
            declare(app)
        return Incarnation(self._lives, app)


def instrument(fn: Callable[..., Any], on_done: Callable[[Any], bool],
               on_start: Callable[[Any], Any] | None = None) -> Callable[..., Any]:
    """Wrap a worker function so the simulator sees each completed side effect.

    The wrapper always receives ``ctx`` (it adds the parameter if ``fn`` lacks it) and calls
    ``on_done(ctx)`` after ``fn`` returns; if that returns True the ack is lost: the delivery
    ends with neither ack nor nack, as when a process dies right after its side effect.
    ``on_start(ctx)``, when given, returns the ``ctx`` a function that asks for one receives
    (the job-log ledger's, ``logledger.py``).
    """
    sig = inspect.signature(fn)
    wants_ctx = "ctx" in sig.parameters
    is_async = inspect.iscoroutinefunction(fn)

    @functools.wraps(fn)
    async def wrapped(job: Any, **kwargs: Any) -> Any:
        ctx = kwargs["ctx"] if wants_ctx else kwargs.pop("ctx")
        if wants_ctx and on_start is not None:
            kwargs["ctx"] = on_start(ctx)
        result = fn(job, **kwargs)
        if is_async:
            result = await result
        if on_done(ctx):
            raise asyncio.CancelledError("ack lost (simulated)")
        return result

    if not wants_ctx:
        params = list(sig.parameters.values())
        extra = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY)
        if params and params[-1].kind == inspect.Parameter.VAR_KEYWORD:
            params.insert(len(params) - 1, extra)
        else:
            params.append(extra)
        wrapped.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    return wrapped


class _LateBound:
    """``node.method``: calls the method of the node's app alive at call time."""

    def __init__(self, node: SimNode, attr: str) -> None:
        self.__self__ = node
        self.__name__ = attr

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.__self__.app, self.__name__)(*args, **kwargs)
