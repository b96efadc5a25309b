"""The Transport contract (``tests/transport_contract.py``) on every adapter.

- Zenoh: real sessions on a private loopback mesh. A killed node is a closed session (a crashed
  process is only noticed at Zenoh's lease expiry, seconds later); a restarted one is a new
  session on a new port that connects to the others.
- The in-process mesh on the real loop, reliable (what tests and notebooks use).
- The in-process mesh on the simulator's virtual loop with its latency model (what the simulator
  uses): timeouts are exact virtual time and a kill cancels the node's handler tasks.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from transport_contract import Mesh, TransportContract
from virtual import on_virtual_loop
from zenoh_util import free_port, peer_config, unique_prefix, wait_until

from istos.transport.base import Transport
from istos.transport.local import LocalMesh, LocalTransport, NetworkModel
from istos.transport.zenoh import ZenohTransport
from istos_nb.sim.network import SimNetwork
from istos_nb.sim.vloop import VirtualEventLoop

# -- the in-process mesh ---------------------------------------------------------------------------


class _Local(Mesh):
    def __init__(self, registry: LocalMesh, nodes: list[Transport]) -> None:
        super().__init__(nodes, "istos-test/local")
        self.registry = registry

    async def kill(self, i: int) -> None:
        node = self.nodes[i]
        assert isinstance(node, LocalTransport)
        node.kill()

    async def restart(self, i: int) -> Transport:
        node = self.registry.transport(self.nodes[i].node_id)
        await node.start()
        self.nodes[i] = node
        return node


class LocalFactory:
    def __init__(self, network: NetworkModel | None = None, restart_cycles: int = 300) -> None:
        self.network = network
        self.restart_cycles = restart_cycles

    @asynccontextmanager
    async def open(self, n: int) -> AsyncIterator[Mesh]:
        registry = LocalMesh(self.network)
        nodes: list[Transport] = [registry.transport(f"n{i}") for i in range(n)]
        for node in nodes:
            await node.start()
        mesh = _Local(registry, nodes)
        try:
            yield mesh
        finally:
            for node in mesh.nodes:
                await node.close()


@pytest.mark.fast
class TestLocalMeshContract(TransportContract):
    @pytest.fixture
    def make_mesh(self) -> LocalFactory:
        return LocalFactory()


@on_virtual_loop
@pytest.mark.fast
class TestSimulatedMeshContract(TransportContract):
    @pytest.fixture
    def make_mesh(self) -> LocalFactory:
        return LocalFactory(SimNetwork(random.Random(13), latency_s=(0.0005, 0.02)))

    async def test_runs_on_virtual_time(self) -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, VirtualEventLoop)
        await asyncio.sleep(600)  # costs no wall time
        assert loop.time() == 600.0


# -- Zenoh -----------------------------------------------------------------------------------------


class _Zenoh(Mesh):
    def __init__(self, nodes: list[Transport], endpoints: list[str]) -> None:
        super().__init__(nodes, unique_prefix())
        self.endpoints = endpoints
        self.down: set[int] = set()

    async def kill(self, i: int) -> None:
        self.down.add(i)
        await self.nodes[i].close()

    async def restart(self, i: int) -> Transport:
        listen = f"tcp/127.0.0.1:{free_port()}"
        peers = [e for j, e in enumerate(self.endpoints) if j != i and j not in self.down]
        node = ZenohTransport(peer_config(listen, peers), node_id=self.nodes[i].node_id)
        await node.start()
        self.nodes[i], self.endpoints[i] = node, listen
        self.down.discard(i)
        await self.connected()
        return node

    async def connected(self) -> None:
        up = [t for j, t in enumerate(self.nodes) if j not in self.down]
        await wait_until(lambda: all(len(_z(t).peer_ids()) == len(up) - 1 for t in up),
                         self.within_s, "every live peer connected")

    async def close(self) -> None:
        await asyncio.gather(*(t.close() for t in self.nodes))


def _z(t: Any) -> ZenohTransport:
    assert isinstance(t, ZenohTransport)
    return t


class ZenohFactory:
    restart_cycles = 50

    @asynccontextmanager
    async def open(self, n: int) -> AsyncIterator[Mesh]:
        endpoints = [f"tcp/127.0.0.1:{free_port()}" for _ in range(n)]
        nodes: list[Transport] = [ZenohTransport(peer_config(e, endpoints[:i]), node_id=f"n{i}")
                                  for i, e in enumerate(endpoints)]
        mesh = _Zenoh(nodes, endpoints)
        try:
            for node in nodes:  # in order: node i connects to the earlier, listening ones
                await node.start()
            await mesh.connected()
            yield mesh
        finally:
            await mesh.close()


class TestZenohContract(TransportContract):
    @pytest.fixture
    def make_mesh(self) -> ZenohFactory:
        return ZenohFactory()
