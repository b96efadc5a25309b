"""The behaviour every Transport adapter must share, as a reusable pytest base class.

Use it by subclassing :class:`TransportContract` in a ``Test*`` class and providing one fixture,
``make_mesh``: a :class:`MeshFactory` whose ``open(n)`` is an async context manager yielding a
:class:`Mesh` of ``n`` started nodes that can see each other. A mesh can kill node ``i`` (it
vanishes: its registrations and tokens go, as in a crash) and restart it under the same node id
(a new transport with nothing declared). Leaving the context closes every node.

Each test opens its own mesh inside the test body, so the same tests can also run on the
simulator's virtual loop (see ``tests/virtual.py``), where a fixture could not await.

Every wait is bounded by ``Mesh.within_s``. Waits are on events (a handler recording what it saw);
only route propagation, which has no event, is polled (:meth:`Mesh.query_served`,
:meth:`Mesh.routed`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

import pytest

from istos.transport.base import (
    NoResponder,
    QueryHandler,
    Transport,
    TransportError,
    TransportTimeout,
)

POLL_S = 0.005


class Mesh:
    """``n`` nodes of one adapter; subclasses implement :meth:`kill` and :meth:`restart`."""

    #: bound for every wait on delivery or propagation, in loop seconds
    within_s: float = 5.0

    def __init__(self, nodes: list[Transport], prefix: str) -> None:
        self.nodes = nodes
        self.prefix = prefix

    async def kill(self, i: int) -> None:
        raise NotImplementedError

    async def restart(self, i: int) -> Transport:
        """Start node ``i`` again (after :meth:`kill`) with the same node id; return it."""
        raise NotImplementedError

    async def query_served(self, i: int, key: str, payload: bytes = b"",
                           timeout_s: float = 2.0) -> bytes:
        """Node ``i`` queries ``key``, retrying while a fresh declaration has no route yet."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.within_s
        while True:
            try:
                return await self.nodes[i].query(key, payload, timeout_s)
            except NoResponder:
                if loop.time() >= deadline:
                    raise
                await asyncio.sleep(POLL_S)

    async def routed(self, i: int, key: str, seen: Callable[[], bool]) -> None:
        """Node ``i`` puts probes on ``key`` until ``seen()``: a subscriber route exists."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.within_s
        while not seen():
            if loop.time() >= deadline:
                raise AssertionError(f"no subscriber route for {key!r} within {self.within_s} s")
            await self.nodes[i].put(key, b"probe")
            await asyncio.sleep(POLL_S)


class MeshFactory(Protocol):
    #: kill/restart cycles the long liveliness test runs (an adapter's restarts cost differ)
    restart_cycles: int

    def open(self, n: int) -> AbstractAsyncContextManager[Mesh]: ...


class Recorder:
    """Collects what a handler is called with; :meth:`wait_for` waits on it with a bound."""

    def __init__(self, within_s: float) -> None:
        self.seen: list[tuple[str, object]] = []
        self._changed = asyncio.Event()
        self._within_s = within_s

    def __call__(self, key: str, value: object) -> None:
        self.seen.append((key, value))
        self._changed.set()

    async def wait_for(self, pred: Callable[[list[tuple[str, object]]], bool],
                       what: str = "") -> None:
        async def until() -> None:
            while not pred(self.seen):
                self._changed.clear()
                await self._changed.wait()

        try:
            await asyncio.wait_for(until(), self._within_s)
        except asyncio.TimeoutError:
            raise AssertionError(f"not seen within {self._within_s} s: {what}; "
                                 f"seen {self.seen[-10:]!r}") from None

    def has(self, key: str, value: object) -> Callable[[list[tuple[str, object]]], bool]:
        return lambda seen: (key, value) in seen

    def counted(self, key: str, value: object,
                n: int) -> Callable[[list[tuple[str, object]]], bool]:
        return lambda seen: seen.count((key, value)) == n


def _echo(tag: bytes = b"") -> QueryHandler:
    async def handler(key: str, data: bytes) -> bytes:
        return tag + key.encode() + b"|" + data

    return handler


class TransportContract:
    """Subclass with a ``make_mesh`` fixture; see the module docstring."""

    # -- request / reply --------------------------------------------------------------------------

    async def test_satisfies_protocol(self, make_mesh: MeshFactory) -> None:
        async with make_mesh.open(1) as mesh:
            assert isinstance(mesh.nodes[0], Transport)
            assert isinstance(mesh.nodes[0].node_id, str) and mesh.nodes[0].node_id

    async def test_query_reply_across_nodes(self, make_mesh: MeshFactory) -> None:
        async with make_mesh.open(2) as mesh:
            key = f"{mesh.prefix}/rpc/echo"
            await mesh.nodes[0].declare_queryable(key, _echo())
            assert await mesh.query_served(1, key, b"hello") == key.encode() + b"|hello"
            assert await mesh.nodes[1].query(key, b"", 2.0) == key.encode() + b"|"
            binary = bytes(range(256)) * 64
            assert await mesh.nodes[1].query(key, binary, 2.0) == key.encode() + b"|" + binary

    async def test_wildcard_queryable_sees_the_concrete_key(self, make_mesh: MeshFactory) -> None:
        async with make_mesh.open(2) as mesh:
            await mesh.nodes[0].declare_queryable(f"{mesh.prefix}/rpc/*",
                                                  _echo())
            key = f"{mesh.prefix}/rpc/jobs"
            assert await mesh.query_served(1, key, b"x") == key.encode() + b"|x"

    async def test_concurrent_queries_each_get_their_own_reply(
            self, make_mesh: MeshFactory) -> None:
        async with make_mesh.open(2) as mesh:
            key = f"{mesh.prefix}/rpc/echo"
            await mesh.nodes[0].declare_queryable(key, _echo())
            await mesh.query_served(1, key)
            replies = await asyncio.gather(
                *(mesh.nodes[1].query(key, str(i).encode(), 5.0) for i in range(100)))
            assert replies == [key.encode() + b"|" + str(i).encode() for i in range(100)]

    async def test_handlers_that_wait_are_answered_once_their_waits_end(
            self, make_mesh: MeshFactory) -> None:
        # The Zenoh transport runs a handler eagerly up to its first await: the rest must
        # still run, in a Task, however many times it suspends, while other queries pass it.
        async with make_mesh.open(2) as mesh:
            key = f"{mesh.prefix}/rpc/slow"
            gate = asyncio.Event()

            async def slow(k: str, data: bytes) -> bytes:
                await asyncio.sleep(0)
                if data == b"gate":
                    await gate.wait()
                await asyncio.wait_for(asyncio.sleep(0.001), 1.0)
                return b"done:" + data

            await mesh.nodes[0].declare_queryable(key, slow)
            await mesh.query_served(1, key)
            gated = asyncio.ensure_future(mesh.nodes[1].query(key, b"gate", 5.0))
            others = await asyncio.gather(
                *(mesh.nodes[1].query(key, str(i).encode(), 5.0) for i in range(20)))
            assert others == [b"done:" + str(i).encode() for i in range(20)]
            assert not gated.done()
            gate.set()
            assert await asyncio.wait_for(gated, 5.0) == b"done:gate"

    async def test_nobody_serving_is_no_responder(self, make_mesh: MeshFactory) -> None:
        async with make_mesh.open(2) as mesh:
            with pytest.raises(NoResponder):
                await mesh.nodes[1].query(f"{mesh.prefix}/rpc/nobody", b"", 2.0)

    async def test_unanswered_query_times_out_not_before_the_timeout(
            self, make_mesh: MeshFactory) -> None:
        async with make_mesh.open(2) as mesh:
            key = f"{mesh.prefix}/rpc/stuck"
            release = asyncio.Event()
            arrived = Recorder(mesh.within_s)

            async def stuck(k: str, data: bytes) -> bytes:
                arrived(k, data)
                await release.wait()
                return b"late"

            await mesh.nodes[0].declare_queryable(key, stuck)
            loop = asyncio.get_running_loop()
            for _ in range(3):
                started = loop.time()
                try:
                    with pytest.raises(TransportTimeout):
                        await mesh.nodes[1].query(key, b"", 0.3)
                except NoResponder:  # the route is not there yet: try again
                    await asyncio.sleep(POLL_S)
                    continue
                # The loop may fire a timer up to its clock resolution early.
                assert loop.time() - started >= 0.3 - 1e-6
                break
            else:
                raise AssertionError("the stuck queryable never became reachable")
            assert arrived.seen, "the handler never saw the query it left unanswered"
            release.set()

    async def test_handler_failure_is_an_error_not_silence(self, make_mesh: MeshFactory) -> None:
        async with make_mesh.open(2) as mesh:
            key = f"{mesh.prefix}/rpc/broken"

            async def broken(k: str, data: bytes) -> bytes:
                raise ValueError("handler bug")

            await mesh.nodes[0].declare_queryable(key, broken)
            with pytest.raises(TransportError) as info:
                await mesh.query_served(1, key)
            assert not isinstance(info.value, (NoResponder, TransportTimeout))

    async def test_closed_queryable_stops_serving(self, make_mesh: MeshFactory) -> None:
        async with make_mesh.open(2) as mesh:
            key = f"{mesh.prefix}/rpc/echo"
            handle = await mesh.nodes[0].declare_queryable(key, _echo())
            await mesh.query_served(1, key)
            handle.close()
            handle.close()  # idempotent
            loop = asyncio.get_running_loop()
            deadline = loop.time() + mesh.within_s
            while True:  # the undeclaration propagates: replies stop within the bound
                try:
                    await mesh.nodes[1].query(key, b"", 1.0)
                except NoResponder:
                    break
                assert loop.time() < deadline, "a closed queryable still answers"
                await asyncio.sleep(POLL_S)

    async def test_closed_node_refuses_work(self, make_mesh: MeshFactory) -> None:
        async with make_mesh.open(2) as mesh:
            await mesh.kill(1)
            gone = mesh.nodes[1]
            with pytest.raises(TransportError):
                await gone.query(f"{mesh.prefix}/rpc/x", b"", 1.0)
            with pytest.raises(TransportError):
                await gone.declare_queryable(f"{mesh.prefix}/rpc/x", _echo())
            with pytest.raises(TransportError):
                await gone.declare_liveliness_token(f"{mesh.prefix}/live/x")

    # -- put / subscribe --------------------------------------------------------------------------

    async def test_put_reaches_every_matching_subscriber(self, make_mesh: MeshFactory) -> None:
        async with make_mesh.open(3) as mesh:
            base = f"{mesh.prefix}/ev"
            far, near, other = (Recorder(mesh.within_s) for _ in range(3))
            await mesh.nodes[1].declare_subscriber(f"{base}/**", far)
            await mesh.nodes[0].declare_subscriber(f"{base}/*", near)  # the publisher's own
            await mesh.nodes[2].declare_subscriber(f"{mesh.prefix}/elsewhere/**", other)
            await mesh.routed(0, f"{base}/probe", lambda: bool(far.seen) and bool(near.seen))
            sent = [(f"{base}/k{i}", str(i).encode()) for i in range(50)]
            for key, payload in sent:
                await mesh.nodes[0].put(key, payload)
            for rec in (far, near):
                await rec.wait_for(lambda seen: all(s in seen for s in sent), "all 50 samples")
            await mesh.nodes[0].put(f"{base}/deep/er", b"d")
            await far.wait_for(far.has(f"{base}/deep/er", b"d"), "a sample two chunks deep")
            assert (f"{base}/deep/er", b"d") not in near.seen  # '*' is one chunk only
            assert other.seen == []

    async def test_closed_subscriber_hears_nothing_more(self, make_mesh: MeshFactory) -> None:
        async with make_mesh.open(2) as mesh:
            key = f"{mesh.prefix}/ev/x"
            closing, barrier = Recorder(mesh.within_s), Recorder(mesh.within_s)
            handle = await mesh.nodes[1].declare_subscriber(key, closing)
            await mesh.nodes[1].declare_subscriber(f"{mesh.prefix}/ev/*", barrier)
            await mesh.routed(0, key, lambda: bool(closing.seen) and bool(barrier.seen))
            handle.close()
            handle.close()
            heard = len(closing.seen)
            for i in range(20):
                await mesh.nodes[0].put(key, b"after-%d" % i)
            await barrier.wait_for(barrier.has(key, b"after-19"), "the last put")
            assert len(closing.seen) == heard

    # -- liveliness -------------------------------------------------------------------------------

    async def test_watch_reports_current_tokens_then_changes(
            self, make_mesh: MeshFactory) -> None:
        async with make_mesh.open(2) as mesh:
            live = f"{mesh.prefix}/live"
            await mesh.nodes[0].declare_liveliness_token(f"{live}/a")
            early = Recorder(mesh.within_s)
            await mesh.nodes[1].watch_liveliness(f"{live}/**", early)
            await early.wait_for(early.has(f"{live}/a", True), "an existing token")
            token_b = await mesh.nodes[0].declare_liveliness_token(f"{live}/b")
            await early.wait_for(early.has(f"{live}/b", True), "a new token")
            assert await self._alive(mesh, 1, f"{live}/**", [f"{live}/a", f"{live}/b"])
            token_b.close()
            token_b.close()
            await early.wait_for(early.has(f"{live}/b", False), "a closed token")
            assert await self._alive(mesh, 1, f"{live}/**", [f"{live}/a"])
            assert (f"{live}/a", False) not in early.seen
            own = Recorder(mesh.within_s)  # a node sees its own tokens too
            await mesh.nodes[0].watch_liveliness(f"{live}/*", own)
            await own.wait_for(own.has(f"{live}/a", True), "the node's own token")

    async def test_closed_watch_hears_nothing_more(self, make_mesh: MeshFactory) -> None:
        async with make_mesh.open(2) as mesh:
            live = f"{mesh.prefix}/live"
            closing, other = Recorder(mesh.within_s), Recorder(mesh.within_s)
            handle = await mesh.nodes[1].watch_liveliness(f"{live}/**", closing)
            await mesh.nodes[1].watch_liveliness(f"{live}/**", other)
            handle.close()
            token = await mesh.nodes[0].declare_liveliness_token(f"{live}/a")
            await other.wait_for(other.has(f"{live}/a", True), "the token")
            token.close()
            await other.wait_for(other.has(f"{live}/a", False), "the token dropping")
            assert closing.seen == []

    async def test_killed_node_tokens_drop_and_come_back_on_restart(
            self, make_mesh: MeshFactory) -> None:
        async with make_mesh.open(3) as mesh:
            live = f"{mesh.prefix}/live"
            watch = Recorder(mesh.within_s)
            await mesh.nodes[0].watch_liveliness(f"{live}/**", watch)
            await mesh.nodes[1].declare_liveliness_token(f"{live}/n1")
            await mesh.nodes[2].declare_liveliness_token(f"{live}/n2")
            await watch.wait_for(lambda s: (f"{live}/n1", True) in s and (f"{live}/n2", True) in s,
                                 "both tokens")
            await mesh.kill(2)
            await watch.wait_for(watch.has(f"{live}/n2", False), "the killed node's token")
            assert await self._alive(mesh, 0, f"{live}/**", [f"{live}/n1"])
            assert await self._alive(mesh, 1, f"{live}/**", [f"{live}/n1"])
            node = await mesh.restart(2)
            await node.declare_liveliness_token(f"{live}/n2")
            await watch.wait_for(watch.counted(f"{live}/n2", True, 2), "the token again")
            assert await self._alive(mesh, 1, f"{live}/**", [f"{live}/n1", f"{live}/n2"])

    async def test_liveliness_and_queries_across_many_restarts(
            self, make_mesh: MeshFactory) -> None:
        """Every cycle: kill node 1 and start it again; its fresh watch must be told the token
        node 0 has held all along, node 0's watch must see node 1's token come and go, and a
        query reaches the new incarnation's queryable, never a dead one."""
        async with make_mesh.open(2) as mesh:
            live, rpc = f"{mesh.prefix}/live", f"{mesh.prefix}/rpc/who"
            stay, back = f"{live}/n0", f"{live}/n1"
            await mesh.nodes[0].declare_liveliness_token(stay)
            long_watch = Recorder(mesh.within_s)
            await mesh.nodes[0].watch_liveliness(f"{live}/*", long_watch)
            for cycle in range(make_mesh.restart_cycles):
                node = mesh.nodes[1] if cycle == 0 else await mesh.restart(1)
                fresh = Recorder(mesh.within_s)
                await node.watch_liveliness(f"{live}/*", fresh)
                await fresh.wait_for(fresh.has(stay, True),
                                     f"cycle {cycle}: the live token of node 0")
                await node.declare_liveliness_token(back)
                await node.declare_queryable(rpc, _echo(b"%d:" % cycle))
                await long_watch.wait_for(
                    long_watch.counted(back, True, cycle + 1),
                    f"cycle {cycle}: node 1's token")
                assert (await mesh.query_served(0, rpc)).startswith(b"%d:" % cycle)
                await mesh.kill(1)
                await long_watch.wait_for(
                    long_watch.counted(back, False, cycle + 1),
                    f"cycle {cycle}: node 1's token dropping")
                assert fresh.seen.count((stay, True)) == 1
            assert (stay, False) not in long_watch.seen
            assert await self._alive(mesh, 0, f"{live}/*", [stay])

    @staticmethod
    async def _alive(mesh: Mesh, i: int, key_expr: str, want: list[str]) -> bool:
        """Whether ``liveliness_alive`` on node ``i`` settles to ``want`` within the bound."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + mesh.within_s
        while True:
            got = await mesh.nodes[i].liveliness_alive(key_expr, 1.0)
            if got == want:
                return True
            if loop.time() >= deadline:
                raise AssertionError(f"liveliness_alive({key_expr!r}) = {got}, want {want}")
            await asyncio.sleep(POLL_S)

