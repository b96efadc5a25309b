"""The persister's side write: changes queued behind a batch in flight go out at once when none
of their keys is in it, in order otherwise; failures fail what is queued behind, and a side
write stands on its own. Driven over the real MemoryStorage, each apply held at a gate the test
opens (no timing)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from istos.errors import StorageUnavailable
from istos.owner.persist import Persister
from istos.storage.memory import MemoryStorage

pytestmark = pytest.mark.fast

NS = "jobs:q"


class GatedStorage(MemoryStorage):
    """MemoryStorage whose every ``apply`` waits for the test to open its gate (or fail it);
    ``calls`` lists each apply's keys in the order they reached storage."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[set[str]] = []
        self.gates: list[asyncio.Future[None]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.arrived = asyncio.Event()

    async def apply(self, ns: str, puts: list[tuple[str, bytes]], deletes: list[str], *,
                    fence: Any = None) -> None:
        self.calls.append({k for k, _ in puts} | set(deletes))
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.gates.append(gate)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.arrived.set()
        try:
            await gate
        finally:
            self.in_flight -= 1
        await super().apply(ns, puts, deletes, fence=fence)

    async def reaches(self, n: int) -> None:
        """Until ``n`` applies reached storage (bounded)."""
        async def wait() -> None:
            while len(self.calls) < n:
                self.arrived.clear()
                await self.arrived.wait()
        await asyncio.wait_for(wait(), 5)

    def open_gate(self, i: int, error: Exception | None = None) -> None:
        if error is None:
            self.gates[i].set_result(None)
        else:
            self.gates[i].set_exception(error)


def start(persister: Persister, keys: list[str], undo: str | None = None) -> asyncio.Task[None]:
    """A caller writing ``keys`` (deletes: the simplest change), its undo tagged ``undo``."""
    snaps: Any = {k: f"{undo}:{k}" for k in keys} if undo else None
    return asyncio.ensure_future(persister.write(keys, snaps))


async def settled(task: asyncio.Task[None]) -> None:
    await asyncio.wait_for(asyncio.shield(task), 5)


async def test_disjoint_changes_overtake_and_the_same_key_waits_its_turn():
    store = GatedStorage()
    p = Persister(store, NS)
    first = start(p, ["a"])
    await store.reaches(1)
    other = start(p, ["b"])  # no key of the batch in flight: out at once
    await store.reaches(2)
    assert store.calls == [{"a"}, {"b"}] and store.in_flight == 2
    same = start(p, ["a", "c"])  # key a is in flight: it waits for the ordered loop
    store.open_gate(1)
    await settled(other)
    assert not first.done() and not same.done() and len(store.calls) == 2
    store.open_gate(0)
    await settled(first)
    await store.reaches(3)
    assert store.calls[2] == {"a", "c"}
    store.open_gate(2)
    await settled(same)


async def test_the_next_batch_waits_for_the_side_write_it_was_queued_behind():
    store = GatedStorage()
    p = Persister(store, NS)
    first = start(p, ["a"])
    await store.reaches(1)
    side = start(p, ["b"])
    await store.reaches(2)
    later = start(p, ["b", "d"])  # queued behind the side write (same key b)
    store.open_gate(0)
    await settled(first)
    for _ in range(5):  # the loop's turns pass; the batch must not leave before b is stored
        await asyncio.sleep(0)
    assert len(store.calls) == 2 and not later.done()
    store.open_gate(1)
    await settled(side)
    await store.reaches(3)
    store.open_gate(2)
    await settled(later)
    assert store.most_in_flight == 2


async def test_a_failed_side_write_fails_what_was_queued_behind_it_not_the_batch_before():
    store = GatedStorage()
    failed: list[dict[str, Any]] = []
    p = Persister(store, NS, on_failure=lambda undo, err: failed.append(dict(undo)))
    first = start(p, ["a"], undo="first")
    await store.reaches(1)
    side = start(p, ["b"], undo="side")
    await store.reaches(2)
    behind = start(p, ["b", "e"], undo="behind")
    store.open_gate(1, ConnectionError("redis went away"))
    with pytest.raises(StorageUnavailable):
        await settled(side)
    with pytest.raises(StorageUnavailable):
        await settled(behind)
    assert failed == [{"b": "side:b", "e": "behind:e"}]  # the earliest snapshot of b
    store.open_gate(0)
    await settled(first)  # the batch in flight before it stands
    assert len(store.calls) == 2


async def test_a_side_write_stands_when_the_batch_it_overtook_fails():
    store = GatedStorage()
    failed: list[dict[str, Any]] = []
    p = Persister(store, NS, on_failure=lambda undo, err: failed.append(dict(undo)))
    first = start(p, ["a"], undo="first")
    await store.reaches(1)
    side = start(p, ["b"], undo="side")
    await store.reaches(2)
    queued = start(p, ["a", "f"], undo="queued")  # behind the first batch (key a)
    store.open_gate(0, ConnectionError("timeout"))
    with pytest.raises(StorageUnavailable):
        await settled(first)
    with pytest.raises(StorageUnavailable):
        await settled(queued)
    assert failed == [{"a": "first:a", "f": "queued:f"}]  # b is none of theirs
    store.open_gate(1)
    await settled(side)
    assert len(store.calls) == 2


async def test_a_caller_with_no_changes_keeps_the_queue_in_order():
    """A caller with no changes waits for everything in flight: nothing overtakes with it."""
    store = GatedStorage()
    p = Persister(store, NS)
    first = start(p, ["a"])
    await store.reaches(1)
    bare = asyncio.ensure_future(p.write([]))
    other = start(p, ["b"])
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(store.calls) == 1 and not bare.done()
    store.open_gate(0)
    await settled(first)
    await store.reaches(2)
    store.open_gate(1)
    await settled(bare)
    await settled(other)
    assert store.most_in_flight == 1


async def test_without_overtaking_writes_never_overlap(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(Persister, "overtake", False)
    store = GatedStorage()
    p = Persister(store, NS)
    first = start(p, ["a"])
    await store.reaches(1)
    other = start(p, ["b"])
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(store.calls) == 1
    store.open_gate(0)
    await store.reaches(2)
    store.open_gate(1)
    await settled(first)
    await settled(other)
    assert store.most_in_flight == 1
