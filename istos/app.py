"""Istos: declare queues and workers, serve them, and put jobs on queues.

Declarations (``queue``, ``worker``, ``schedule``) only record intent; ``serving()`` (inside an
existing event loop) or ``run()`` (blocking) brings them up on the node's transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import signal
import socket
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from . import protocol
from .client import OwnerClient
from .client.pausing import Pausing
from .clock import Clock, SystemClock
from .core.config import QueueConfig, WorkerConfig
from .core.records import JobRecord
from .delegate import delegate
from .errors import ConfigError, HAConfigError, IstosError, ProtocolError
from .events import EventLog
from .features.batch import Batches
from .features.deps import Dependencies
from .features.ledger import Ledger
from .features.pubsub import PubSub, Subscription
from .features.schedule import Schedules
from .features.workflow import Workflows
from .ids import IdSource
from .node import Node, RunSync
from .owner.composition import compose
from .owner.extension import Hooks
from .owner.extensions.leases_ext import LeaseOps
from .owner.extensions.parking import ParkedClaims
from .owner.leadership.election import Election
from .owner.owner import QueueOwner
from .owner.views.inspect import Inspector
from .owner.views.lookup import IdLookup
from .owner.views.operator_ext import operator_extensions
from .owner.views.series import SeriesKeeper
from .payload import CodecChain, PayloadCodec
from .pipeline import DEFAULT_MAX_IN_FLIGHT, Pipeline
from .producer import Producer
from .storage.base import Fence, Storage
from .storage.memory import MemoryStorage
from .tracing import make_tracing
from .transport.base import Handle, Transport
from .worker.parking import declare_worker_tokens
from .worker.worker import WorkerRunner

if TYPE_CHECKING:  # imported on use: it needs SQLAlchemy
    from .outbox.relay import OutboxRelay
    from .outbox.store import OutboxStore

log = logging.getLogger("istos")
F = TypeVar("F", bound=Callable[..., Any])


class Istos:
    """One node of an Istos mesh: it may own queues, work them and put jobs on them.

    ``storage``: where owners write their jobs through (default: in memory, volatile).
    ``zenoh``: a ``zenoh.Config``, a dict, inline JSON5 or a path to a JSON5 file; None uses
    Zenoh's defaults (peer mode with multicast scouting: nodes on one host find each other).
    ``prefix``: the key prefix every queue of this node lives under; nodes meet only under the
    same prefix. ``request_timeout_s`` bounds each request to an owner (then
    :class:`OwnerUnavailable`); ``shutdown_grace_s`` is how long :meth:`stop` lets running
    jobs finish. ``codecs``: payload codecs (``istos.payload``: compression, encryption) this
    app's producers apply to the bodies they enqueue and its workers undo before running, and
    to results; producers and workers of a queue need the same list, its owner none.
    ``tracing``: OpenTelemetry spans from enqueue to ack (``istos.tracing``): None traces
    when ``opentelemetry`` is installed, False never, True always, or a ``TracerProvider``
    to trace with instead of the global one. The other
    keyword-only arguments inject the other ports (the simulator and tests use them). Raises
    :class:`ConfigError` for ``request_timeout_s <= 0``, a ``node_id`` the wire refuses, a
    codec that is not one, or ``tracing`` it cannot honour (True without ``opentelemetry``);
    a Zenoh config is checked when the node starts.

    Workflows, schedules, pub/sub and the idempotency ledger are components the app owns
    (``app.workflows``, ``app.schedules``, ``app.pubsub``, ``app.ledger``); the methods below
    that name one are those components' own, delegated.
    """

    chain = delegate("workflows", Workflows.chain)
    group = delegate("workflows", Workflows.group)
    chord = delegate("workflows", Workflows.chord)
    revive = delegate("workflows", Workflows.revive)
    requeue_dead = delegate("workflows", Workflows.requeue_dead)  # deprecated: revive
    batch = delegate("batches", Batches.batch)
    batch_status = delegate("batches", Batches.batch_status)
    schedule = delegate("schedules", Schedules.schedule)
    subscribe = delegate("pubsub", PubSub.subscribe)
    publish = delegate("pubsub", PubSub.publish)
    idempotent = delegate("ledger", Ledger.claim)
    ledger_status = delegate("ledger", Ledger.status)
    ledger_purge = delegate("ledger", Ledger.purge_expired)
    enqueue = delegate("producer", Producer.enqueue)
    enqueue_many = delegate("producer", Producer.enqueue_many)
    dead_letters = delegate("producer", Producer.dead_letters)
    job_logs = delegate("producer", Producer.job_logs)
    result = delegate("producer", Producer.result)
    cancel = delegate("producer", Producer.cancel)
    pause = delegate("pausing", Pausing.pause)
    resume = delegate("pausing", Pausing.resume)
    update = delegate("producer", Producer.update)

    def __init__(
        self, storage: Storage | None = None, zenoh: Any = None, *,
        transport: Transport | None = None, clock: Clock | None = None,
        rng: random.Random | None = None, node_id: str | None = None, prefix: str = "istos",
        request_timeout_s: float = 5.0, shutdown_grace_s: float = 10.0,
        run_sync: RunSync | None = None, event_buffer: int = 10_000,
        codecs: Iterable[PayloadCodec] = (), tracing: Any = None,
    ) -> None:
        if request_timeout_s <= 0:
            raise ConfigError(f"request_timeout_s must be > 0, got {request_timeout_s!r}")
        seeded = rng is not None
        rng = rng if rng is not None else random.Random(os.urandom(16))
        if node_id is None and transport is not None:
            node_id = transport.node_id
        node_id = node_id or f"{socket.gethostname()}-{os.getpid()}-{rng.getrandbits(24):06x}"
        try:  # node ids travel in every claim (and in slot ids): the owner checks them
            protocol.check_slot_id("node_id", node_id)
        except ProtocolError as exc:
            raise ConfigError(str(exc)) from None
        id_seed = rng.getrandbits(64)
        # A seeded app (the simulator) gets reproducible lease tokens; a live one OS-random ones.
        ids = IdSource(random.Random(id_seed),
                       token_rng=random.Random(f"tokens:{id_seed}") if seeded else None)
        self.node = Node(node_id=node_id, clock=clock or SystemClock(), rng=rng,
                         ids=ids,
                         storage=storage if storage is not None else MemoryStorage(),
                         transport=transport, prefix=prefix,
                         request_timeout_s=request_timeout_s, run_sync=run_sync,
                         events=EventLog(event_buffer), payload=CodecChain(codecs),
                         tracing=make_tracing(tracing))
        self._zenoh_config = zenoh
        self._own_transport = transport is None
        self.shutdown_grace_s = shutdown_grace_s
        self.queues: dict[str, QueueConfig] = {}
        self.workers: list[tuple[WorkerConfig, Callable[..., Any]]] = []
        self.owners: dict[str, QueueOwner] = {}
        self.node.local_owner = self.owners.get  # in-process calls skip the mesh
        self.runners: list[WorkerRunner] = []
        self._worker_tokens: list[Handle] = []  # worker/parking.py: gone with a dead process
        self._clients: dict[str, OwnerClient] = {}
        self._serving = False
        self._plugins: list[Any] = []  # components with async start()/stop() (schedules...)
        self.elections: dict[str, Election] = {}
        # The components call back into the app through late-bound callables where the app's
        # method may be replaced on the instance (tests gate schedules by is_active_owner).
        self.producer = Producer(self.node, self.client, self._require_serving,
                                 payload=self.node.payload, tracing=self.node.tracing)
        self.pausing = Pausing(self.node.node_id, self.client, self._require_serving)
        self.ledger = Ledger(self.node)
        self.pubsub = PubSub(self.node, add_plugin=self.add_plugin,
                             serving=lambda: self._serving,
                             require_serving=self._require_serving)
        self.schedules = Schedules(self.node, self.queues, client=self.client,
                                   is_active_owner=lambda q: self.is_active_owner(q),
                                   add_plugin=self.add_plugin, serving=lambda: self._serving)
        self.batches = Batches(self.node, self.producer.enqueue, self.client,
                               self._require_serving)
        self.workflows = Workflows(self.node, self.enqueue, self.client, self._require_serving,
                                   open_batch=self.batches.batch)
        self.dependencies = Dependencies(self.node, self.client)

    @property
    def node_id(self) -> str:
        """This node's id on the mesh (the ``node_id`` given, else host, pid and a random
        suffix); owners name workers, leases and events by it."""
        return self.node.node_id

    @property
    def subscriptions(self) -> list[Subscription]:
        """The subscriptions declared on this app (:meth:`subscribe`), in declaration order."""
        return self.pubsub.subscriptions

    @property
    def events(self) -> EventLog:
        """This node's recent JobEvents (from the queues it owns, at most ``event_buffer``
        of them) and their listeners: ``app.events.subscribe(fn)`` calls ``fn(event)`` for each
        new one, on the event loop."""
        return self.node.events

    # -- declarations --
    def queue(self, name: str, *, lease_s: float = 30.0, max_attempts: int = 5,
              retry_backoff_s: float = 1.0, retry_backoff_max_s: float = 600.0,
              retry_jitter: float = 0.1, keep_results: bool = False,
              result_ttl_s: float = 3600.0, sweep_interval_s: float | None = None,
              ha: bool = False, ha_lease_s: float = 5.0, admin: bool = False,
              rate_limit: tuple[int, float] | None = None,
              group_concurrency: int | None = None,
              group_rate_limit: tuple[int, float] | None = None) -> QueueConfig:
        """Own queue ``name`` on this node (served from :meth:`start`); returns its config.

        Options: ``lease_s`` (how long a worker holds a job before it comes back),
        ``max_attempts`` (deliveries before dead-lettering), ``retry_backoff_s`` /
        ``retry_backoff_max_s`` / ``retry_jitter`` (exponential backoff between attempts,
        capped, each delay times a factor in ``[1-j, 1+j]``), ``keep_results`` and
        ``result_ttl_s`` (keep returned values for :meth:`result`), ``sweep_interval_s``
        (default ``min(1, lease_s / 4)``), ``ha`` and ``ha_lease_s`` (replicas sharing durable
        storage elect a leader), ``admin`` (allow cancel, resubmit, revive, purge, pause).
        ``rate_limit=(n, per_s)``: at most ``n`` claims in any ``per_s`` seconds, across all
        workers. Jobs enqueued with a ``group`` are handed out round-robin between groups;
        ``group_concurrency`` caps each group's leased jobs and ``group_rate_limit=(n, per_s)``
        its claims.

        Raises :class:`ConfigError` (a ``ValueError``) naming an invalid option or a queue
        already declared on this app, and :class:`HAConfigError` for ``ha=True`` with storage
        that replicas cannot share.
        """
        config = QueueConfig.build(
            name, lease_s=lease_s, max_attempts=max_attempts, retry_backoff_s=retry_backoff_s,
            retry_backoff_max_s=retry_backoff_max_s, retry_jitter=retry_jitter,
            keep_results=keep_results, result_ttl_s=result_ttl_s,
            sweep_interval_s=sweep_interval_s, ha=ha, admin=admin, ha_lease_s=ha_lease_s,
            rate_limit=rate_limit, group_concurrency=group_concurrency,
            group_rate_limit=group_rate_limit)
        if config.ha and not getattr(self.node.storage, "shared", False):
            raise HAConfigError(
                f"queue {name!r}: ha=True needs storage shared by every replica "
                "(RedisStoragePlugin or SQLAlchemyStoragePlugin); with in-memory storage each "
                "replica would be an island and a failover would lose the queue")
        if name in self.queues:
            raise ConfigError(f"queue {name!r} is already declared on this app")
        self.queues[name] = config
        return config

    def worker(self, name: str, *, concurrency: int = 1, poll_interval_s: float = 1.0,
               prefetch: int | None = None, heartbeat: bool = False,
               timeout_s: float | None = None, park: bool = True) -> Callable[[F], F]:
        """Decorate an async (or plain, run in a thread) function to work queue ``name``.

        The function receives the decoded job body first; returning acks (the value is the
        job's result), raising nacks (the job is retried with backoff, and dead-lettered after
        ``max_attempts``). A parameter named ``ctx`` receives the :class:`JobContext`; a
        parameter defaulting to ``Depends(provider)`` receives the provider's value.
        ``concurrency`` jobs run at once; a plain function runs in a thread pool of that size.
        ``poll_interval_s``: how often an idle worker asks for jobs when no nudge came.

        ``prefetch`` claims up to that many jobs beyond the free slots, so the next job is
        already here when a slot frees (a throughput win for short jobs). Prefetched jobs are
        leased while they wait. The default (None) is automatic: nothing extra until the worker
        has run 8 jobs, and then only while its jobs take under 1% of ``lease_s``; at least
        ``concurrency`` extra jobs, more when a claim's round trip is longer than a job (enough
        to keep every slot busy for one round trip), at most ``4 * concurrency`` and never so
        many that a prefetched job would wait past 1% of its lease. ``0`` turns it off.

        ``heartbeat=True`` renews the leases of every job the worker holds in one request every
        ``lease_s / 3``, so a job may run longer than ``lease_s`` and still run once, and a dead
        worker's jobs come back about ``lease_s`` after it stopped. ``timeout_s`` bounds one run:
        past it the function is cancelled and the attempt nacked with :class:`JobTimeout`.
        ``park``: an idle worker's claim waits at a remote owner (up to ``poll_interval_s``)
        and is answered the moment a job is claimable; False waits for the owner's nudge.

        Raises :class:`ConfigError` naming an invalid option, and when what it decorates is
        not callable.
        """
        config = WorkerConfig.build(name, concurrency=concurrency,
                                    poll_interval_s=poll_interval_s, prefetch=prefetch,
                                    heartbeat=heartbeat, timeout_s=timeout_s, park=park)

        def register(fn: F) -> F:
            if not callable(fn):
                raise ConfigError(f"@app.worker({name!r}) must decorate a function")
            self.workers.append((config, fn))
            return fn

        return register

    def add_plugin(self, plugin: Any) -> None:
        """Register a component whose ``async start(app)`` runs after the queues, workers
        and elections started, and whose ``async stop(app)`` runs before they stop (in reverse
        order of registration). Register before :meth:`start`. Never raises."""
        self._plugins.append(plugin)

    def outbox_relay(self, url: str | OutboxStore, queues: Iterable[str] | None = None,
                     **options: Any) -> OutboxRelay:
        """Relay the committed rows of the outbox at database ``url`` (of ``queues``, or all)
        into their queues while this app serves; returns the :class:`~istos.outbox.OutboxRelay`
        (``options``: its keyword arguments). Needs SQLAlchemy; see ``istos.outbox``."""
        from .outbox.relay import OutboxRelay

        relay = OutboxRelay(self, url, queues=queues, **options)
        self.add_plugin(relay)
        return relay

    # -- lifecycle --
    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[Istos]:
        """Run this node inside the current event loop until the block exits
        (``async with app.serving():``); the node is stopped as :meth:`stop` says when the block
        exits, also by an exception. Raises what :meth:`start` raises, with nothing left
        running."""
        await self.start()
        try:
            yield self
        finally:
            await self.stop()

    async def start(self) -> None:
        """Bring the node up: open storage and the transport, then serve its queues (HA ones
        through an election), start its workers and plugins; returns once all are up.

        If any part fails, what was started is stopped again and it raises the error:
        :class:`IstosError` if the node is already serving, :class:`StorageUnavailable` if
        the storage cannot be reached, :class:`ConfigError` for a Zenoh config Zenoh
        rejects, :class:`MeshUnreachable` when a client-mode session reaches no router, and
        :class:`OwnerConflict` when another node already serves one of its non-HA queues.
        """
        if self._serving:
            raise IstosError(f"app {self.node_id!r} is already serving")
        node = self.node
        if node.transport is None:
            from .transport.zenoh import ZenohTransport
            node.transport = ZenohTransport(self._zenoh_config, node_id=node.node_id)
        await node.storage.open()
        await node.transport.start()
        self._serving = True
        try:
            for config in self.queues.values():
                if not config.ha:  # HA owners start when this replica wins the election
                    await self._start_owner(config)
            self._worker_tokens = await declare_worker_tokens(
                node, {w.queue for w, _ in self.workers if w.park})
            for wconfig, fn in self.workers:
                runner = WorkerRunner(wconfig, fn, node, self.client(wconfig.queue),
                                      continue_hook=self._continue_hook,
                                      batch_of=self.batches.handle_for,
                                      shutdown_grace_s=self.shutdown_grace_s)
                self.runners.append(runner)
                await runner.start()
            for config in self.queues.values():
                if config.ha:
                    election = Election(  # it brings the owner up and down, nothing else
                        config, node, start_owner=functools.partial(self._start_owner, config),
                        stop_owner=functools.partial(self._stop_owner, config.name),
                        current_owner=functools.partial(self.owners.get, config.name))
                    self.elections[config.name] = election
                    await election.start()
            for plugin in self._plugins:
                await plugin.start(self)
        except BaseException:
            await self.stop()
            raise

    async def _start_owner(self, config: QueueConfig, fence: Fence | None = None
                           ) -> QueueOwner:
        """Bind ``config``'s queue on this node (recovering it from storage if durable); an HA
        leader passes its ``fence``, which every write of the owner then carries."""
        owner = QueueOwner(config, self.node, fence=fence)
        self._setup_owner(owner)
        self.owners[config.name] = owner
        await owner.start()
        return owner

    async def _stop_owner(self, name: str) -> None:
        owner = self.owners.pop(name, None)
        if owner is not None:
            await owner.stop()

    def _setup_owner(self, owner: QueueOwner) -> None:
        """Install the extensions every owner of this app serves (before it binds its queue),
        in the declared order of the owner pipeline (``owner/composition.py``)."""
        compose(owner, [
            self.schedules.owner_extension(owner),
            self.workflows.owner_extension(owner),
            self.batches.owner_extension(owner),
            Inspector(owner), IdLookup(owner), SeriesKeeper(owner),
            LeaseOps(owner, on_cancel=lambda node, jobs: self._cancel_local(
                owner.name, node, jobs)),
            *operator_extensions(owner),
            # In-process workers are nudged directly; remote ones over the mesh.
            Hooks(name="local_nudge",
                  on_nudge=lambda n, to: self._nudge_local(owner.name, to)),
            ParkedClaims(owner),
            self.dependencies.owner_extension(owner),
        ])

    async def _continue_hook(self, meta: dict[str, Any], result: Any) -> None:
        """Run by a worker after its function returned, before it acks (workflows)."""
        await self.workflows.continue_after(meta, result)

    def _nudge_local(self, queue: str, targets: set[str]) -> None:
        if self.node.node_id not in targets:
            return
        for runner in self.runners:
            if runner.config.queue == queue:
                runner.on_nudge()

    def _cancel_local(self, queue: str, node: str, job_ids: list[str]) -> None:
        if node == self.node.node_id:
            for runner in self.runners:
                if runner.config.queue == queue:
                    runner.leases.cancel(job_ids)

    def is_active_owner(self, queue: str) -> bool:
        """Whether this node currently serves ``queue`` (for HA: whether it leads). False for
        a queue it never declared; never raises."""
        owner = self.owners.get(queue)
        return owner is not None and owner.running

    def held_records(self) -> list[JobRecord]:
        """Every job record this app's serving owners hold in memory (any state, done
        included), queue by queue in declaration order: a read-only view for an in-process
        observer (the simulator's end-of-run check), what the inspect ops read. An owner that
        does not serve (stopped, fenced, not the leader) holds none. Callers must not change
        the records."""
        return [rec for owner in self.owners.values() if owner.running
                for rec in owner.state.jobs.values()]

    async def stop(self, *, grace_s: float | None = None) -> None:
        """Stop claiming, let in-flight jobs finish (up to ``shutdown_grace_s``, or ``grace_s``
        seconds when given), unbind.

        Workers stop first: jobs still running after the grace, and prefetched jobs not
        started, are cancelled without a nack and handed back to the owner, ready again with
        their attempt not counted (if the owner cannot take them, their leases bring them
        back). The acks and that hand-back still unsent when the grace ends are retried
        for one ``request_timeout_s`` in all, not one per try: while no owner answers, the
        jobs whose acks never landed come back with their leases (they may run again;
        nothing is lost). Then the owners unbind and the transport and storage close.
        Idempotent: on a node that is not serving it returns at once.
        """
        if not self._serving:
            return
        if grace_s is not None:
            for runner in self.runners:
                runner.shutdown_grace_s = grace_s
        for plugin in reversed(self._plugins):
            await plugin.stop(self)
        for election in self.elections.values():
            await election.stop()
        self.elections.clear()
        await asyncio.gather(*(r.stop() for r in self.runners), return_exceptions=True)
        self.runners.clear()
        for handle in self._worker_tokens:  # after the runners ended their parked claims
            handle.close()
        self._worker_tokens = []
        for name in list(self.owners):
            await self._stop_owner(name)
        transport = self.node.transport
        if transport is not None:
            await transport.close()
            if self._own_transport:
                self.node.transport = None
        await self.node.storage.close()
        self._serving = False

    def kill(self) -> None:
        """Die at once, like a crashed process: no ack, no nack, no goodbye, nothing written.

        The simulator's crash. Memory is simply abandoned; with durable storage a restarted
        owner recovers from what was written through before the crash. Never raises.
        """
        for election in self.elections.values():
            election.kill()  # no release: the lease stays until it expires or is taken over
        for runner in self.runners:
            runner.kill()
        for owner in self.owners.values():
            owner.kill()
        transport = self.node.transport
        if transport is not None:
            transport.kill()
        self._serving = False

    def run(self) -> None:
        """Serve until Ctrl-C or SIGTERM, then shut down cleanly (see :meth:`stop`) and
        return. Blocking: it runs its own event loop (``asyncio.run``), so call it where no
        loop runs; inside one, use :meth:`serving`. Raises what :meth:`start` raises."""

        async def main() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.add_signal_handler(sig, stop.set)
            async with self.serving():
                await stop.wait()

        asyncio.run(main())

    # -- producer calls --
    def pipeline(self, name: str, *, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 timeout_s: float | None = None) -> Pipeline:
        """A pipelined producer of queue ``name``: ``async with app.pipeline(name) as p:
        p.enqueue(data)`` returns each id at once (sent, not accepted) and leaving the block
        (or ``await p.flush()``) confirms every id or raises :class:`NotAccepted` listing those
        not confirmed; the exact guarantees are on :class:`~istos.pipeline.Pipeline`.
        Raises :class:`ConfigError` for a bad queue name or option."""
        return Pipeline(self.producer, name, max_in_flight=max_in_flight, timeout_s=timeout_s)

    def client(self, queue: str) -> OwnerClient:
        """The request client of ``queue``'s owner, created on first use and then reused;
        producers, workers and workflows send their requests through it. Never raises
        (its calls raise :class:`OwnerUnavailable` when no owner answers)."""
        client = self._clients.get(queue)
        if client is None:
            client = OwnerClient(self.node, queue)
            self._clients[queue] = client
        return client

    def _require_serving(self) -> None:
        if not self._serving:
            raise IstosError(f"app {self.node_id!r} is not serving: call producer methods inside "
                             "`async with app.serving():` (or from a worker)")
