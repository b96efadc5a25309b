"""A worker that stops while no owner answers: its stop takes about one request timeout, not
one per try of each unsent ack, and the jobs whose acks never landed come back with their
leases (nothing is lost).

Run on the simulator's virtual loop (the in-process mesh, every node's clock on the loop's
time), so the stop's length is read off virtual time: exact, whatever the machine's load.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from istos import Istos, MemoryStorage
from istos.transport.local import LocalMesh
from istos_nb.sim.clock import SimClock
from istos_nb.sim.vrun import run_virtual

pytestmark = pytest.mark.fast

TIMEOUT_S = 2.0  # the worker's request timeout
LEASE_S = 30.0
GRACE_S = 1.0  # the worker's shutdown grace, in the second test


def owners_on(mesh: LocalMesh, storage: MemoryStorage) -> Callable[[str], Istos]:
    """Owner apps of queue ``q`` on ``mesh`` and one shared durable storage, by node name,
    their clocks on the running (virtual) loop's time."""
    loop = asyncio.get_running_loop()

    def owner_app(name: str) -> Istos:
        app = Istos(storage=storage, transport=mesh.transport(name), node_id=name,
                    clock=SimClock(loop))
        app.queue("q", lease_s=LEASE_S, keep_results=True)
        return app

    return owner_app


def test_a_stop_with_no_owner_ends_within_one_request_timeout_and_loses_nothing() -> None:
    async def main() -> tuple[float, list[str], list[str]]:
        loop = asyncio.get_running_loop()
        mesh, storage = LocalMesh(), MemoryStorage(durable=True, shared=True)
        owner_app = owners_on(mesh, storage)

        worker = Istos(transport=mesh.transport("w"), node_id="w", clock=SimClock(loop),
                       request_timeout_s=TIMEOUT_S)
        started, finish = asyncio.Event(), asyncio.Event()
        ran: list[str] = []

        @worker.worker("q", concurrency=2)
        async def handle(job: int) -> None:
            ran.append("w")
            started.set()
            await finish.wait()

        first = owner_app("o1")
        async with worker.serving():
            async with first.serving():
                job_id = await first.enqueue("q", 1)
                await started.wait()
            finish.set()  # the job ends with no owner to take its ack
            stop_began = loop.time()
        stopped_in = loop.time() - stop_began

        # A new owner on the same storage: the job whose ack never landed comes back when
        # its lease ends and runs again (at least once, never lost).
        second = owner_app("o2")
        again = Istos(transport=mesh.transport("w2"), node_id="w2", clock=SimClock(loop))
        done = asyncio.Event()

        @again.worker("q")
        async def handle_again(job: int) -> None:
            ran.append("w2")
            done.set()

        async with second.serving(), again.serving():
            await asyncio.wait_for(done.wait(), LEASE_S * 2)
            states = [(await second.result("q", job_id))["state"]]
            while states[-1] != "done" and len(states) < 100:  # its ack is on its way
                await asyncio.sleep(0.01)  # (virtual time: the loop runs the ack meanwhile)
                states.append((await second.result("q", job_id))["state"])
        return stopped_in, ran, states

    stopped_in, ran, states = run_virtual(main(), until=600.0) or (None, [], [])
    assert stopped_in is not None, "the run did not finish within 600 virtual seconds"
    # Three tries of the ack, each waiting out a request timeout, took over 3 x TIMEOUT_S.
    assert stopped_in <= TIMEOUT_S + 0.5, stopped_in
    assert ran == ["w", "w2"]
    assert states[-1] == "done", states


def test_a_stop_that_hands_jobs_back_with_no_owner_ends_within_its_wind_down() -> None:
    # One job runs past the shutdown grace, two wait prefetched: the stop cancels all three
    # and hands them back in one release, which no owner takes.
    async def main() -> tuple[float, list[str]]:
        loop = asyncio.get_running_loop()
        mesh, storage = LocalMesh(), MemoryStorage(durable=True, shared=True)
        owner_app = owners_on(mesh, storage)

        worker = Istos(transport=mesh.transport("w"), node_id="w", clock=SimClock(loop),
                       request_timeout_s=TIMEOUT_S, shutdown_grace_s=GRACE_S)
        held = asyncio.Event()

        @worker.worker("q", concurrency=1, prefetch=2)
        async def handle(job: int) -> None:
            held.set()
            await asyncio.Event().wait()  # runs until the stop cancels it

        first = owner_app("o1")
        async with worker.serving():
            async with first.serving():
                ids = await first.enqueue_many("q", [1, 2, 3])
                await held.wait()
                while worker.runners[0].stats.peak_held < 3:  # (the prefetch claim lands)
                    await asyncio.sleep(0.01)
            stop_began = loop.time()
        stopped_in = loop.time() - stop_began

        second = owner_app("o2")
        again = Istos(transport=mesh.transport("w2"), node_id="w2", clock=SimClock(loop))

        @again.worker("q", concurrency=3)
        async def handle_again(job: int) -> None:
            return None

        async with second.serving(), again.serving():
            states: list[str] = []
            for _ in range(10_000):  # each job comes back when its lease ends
                states = [(await second.result("q", j))["state"] for j in ids]
                if states == ["done"] * 3:
                    break
                await asyncio.sleep(0.05)
        return stopped_in, states

    stopped_in, states = run_virtual(main(), until=600.0) or (None, [])
    assert stopped_in is not None, "the run did not finish within 600 virtual seconds"
    # The grace, then one request timeout for the release (three tries took three).
    assert stopped_in <= GRACE_S + TIMEOUT_S + 0.5, stopped_in
    assert states == ["done"] * 3
