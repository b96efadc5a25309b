"""An HA leader cut off from its store stands down as its lease lapses, not a renewal interval
or a storage call later: on the virtual loop, times are exact."""

from __future__ import annotations

import asyncio

from virtual import on_virtual_loop

from istos import Istos
from istos.errors import StorageUnavailable
from istos.storage.memory import MemoryStorage
from istos.transport.local import LocalMesh
from istos_nb.sim.clock import SimClock

HA_LEASE_S = 5.0
CALL_S = 0.2  # how long a storage call takes to fail while the store is unreachable


class SlowToFail(MemoryStorage):
    """A store whose calls, while it is unreachable, fail only after CALL_S (a connect
    timeout), as a networked store does."""

    async def renew_leader(self, name: str, holder: str, epoch: int, *, now: float,
                           ttl_s: float) -> bool:
        if not self.available:
            await asyncio.sleep(CALL_S)
            raise StorageUnavailable("the store did not answer (a cut link)")
        return await super().renew_leader(name, holder, epoch, now=now, ttl_s=ttl_s)


@on_virtual_loop
class TestLapse:
    async def test_a_leader_cut_from_its_store_stands_down_when_its_lease_lapses(self) -> None:
        loop = asyncio.get_running_loop()
        clock = SimClock(loop)
        storage = SlowToFail(durable=True, shared=True)
        app = Istos(storage=storage, transport=LocalMesh().transport("a"), node_id="a",
                    clock=clock, request_timeout_s=1.0)
        app.queue("q", ha=True, ha_lease_s=HA_LEASE_S, lease_s=30, sweep_interval_s=0.05)
        await app.start()
        try:
            while not app.is_active_owner("q"):
                await asyncio.sleep(0.01)
            await asyncio.sleep(1.13)  # between two renewals
            lease = await storage.read_leader("ha:q")
            assert lease is not None
            storage.available = False  # no await since the read: no renewal in between
            while app.is_active_owner("q"):
                await asyncio.sleep(0.001)
            late = clock.now() - lease.expires_at
            # A renewal in flight at the lapse is given only what was left of the lease.
            assert 0.0 <= late <= 0.01, late
        finally:
            storage.available = True
            await app.stop()
