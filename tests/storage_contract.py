"""The behaviour every Storage adapter must share, as a reusable pytest base class.

Use it by subclassing :class:`StorageContract` in a ``Test*`` class and providing one fixture,
``make_storage``: an async callable that returns a new, *opened* adapter instance over the same
backing data each time it is called (for a durable backend, a second call is "the process
restarted"). The fixture starts from an empty backend and cleans up after the test, closing every
instance it handed out. Tests that need durability or sharing skip themselves when the adapter
reports ``durable=False`` / ``shared=False``.

The in-memory adapter is the reference: an adapter passes if it is indistinguishable from it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable

import pytest

from istos.errors import FencedOut
from istos.storage.base import Fence, Storage

MakeStorage = Callable[[], Awaitable[Storage]]

# Bound for the racing tests, so a deadlocked backend fails instead of hanging.
RACE_TIMEOUT_S = 20.0
RACERS = 20
NOW = 1_700_000_000.25


async def _race(calls: list[Awaitable[bool]]) -> list[bool]:
    return await asyncio.wait_for(asyncio.gather(*calls), RACE_TIMEOUT_S)


class StorageContract:
    """Subclass with a ``make_storage`` fixture; see the module docstring."""

    @pytest.fixture
    async def storage(self, make_storage: MakeStorage) -> Storage:
        return await make_storage()

    # -- basic round trips --------------------------------------------------------------------

    async def test_satisfies_protocol(self, storage: Storage) -> None:
        assert isinstance(storage, Storage)
        assert isinstance(storage.durable, bool) and isinstance(storage.shared, bool)

    async def test_get_missing_is_none(self, storage: Storage) -> None:
        assert await storage.get("jobs:q", "nope") is None
        assert await storage.scan("jobs:q") == []

    async def test_put_get_delete_round_trip(self, storage: Storage) -> None:
        await storage.put("jobs:q", "j1", b"one")
        assert await storage.get("jobs:q", "j1") == b"one"
        assert await storage.scan("jobs:q") == [("j1", b"one")]
        await storage.delete("jobs:q", "j1")
        assert await storage.get("jobs:q", "j1") is None
        assert await storage.scan("jobs:q") == []

    async def test_delete_missing_is_noop(self, storage: Storage) -> None:
        await storage.delete("jobs:q", "never-written")
        await storage.put("jobs:q", "kept", b"x")
        await storage.delete("jobs:q", "never-written")
        assert await storage.scan("jobs:q") == [("kept", b"x")]

    async def test_overwrite_replaces_value(self, storage: Storage) -> None:
        await storage.put("jobs:q", "j1", b"first")
        await storage.put("jobs:q", "j1", b"second, longer value")
        await storage.put("jobs:q", "j1", b"3")
        assert await storage.get("jobs:q", "j1") == b"3"
        assert await storage.scan("jobs:q") == [("j1", b"3")]

    async def test_namespaces_are_isolated(self, storage: Storage) -> None:
        # Look-alike names: prefixes, suffixes and colons must not alias one another.
        names = ["wf", "wf:q", "wf:q:exp", "wf#exp:q", "jobs:q", "jobs:q2", "ledger"]
        for i, ns in enumerate(names):
            await storage.put(ns, "same-key", f"value-{i}".encode())
        for i, ns in enumerate(names):
            assert await storage.get(ns, "same-key") == f"value-{i}".encode()
            assert await storage.scan(ns) == [("same-key", f"value-{i}".encode())]
        await storage.delete("wf:q", "same-key")
        assert await storage.get("wf:q", "same-key") is None
        assert await storage.get("wf", "same-key") == b"value-0"
        assert await storage.get("wf:q:exp", "same-key") == b"value-2"

    async def test_put_many(self, storage: Storage) -> None:
        await storage.put("jobs:q", "old", b"kept")
        await storage.put("jobs:q", "b", b"to be overwritten")
        await storage.put_many("jobs:q", [("a", b"1"), ("b", b"2"), ("c", b"3")])
        assert dict(await storage.scan("jobs:q")) == {
            "old": b"kept",
            "a": b"1",
            "b": b"2",
            "c": b"3",
        }
        await storage.put_many("jobs:q", [])
        assert len(await storage.scan("jobs:q")) == 4
        assert await storage.scan("jobs:other") == []

    async def test_apply_writes_and_deletes_together(self, storage: Storage) -> None:
        await storage.put_many("jobs:q", [("a", b"1"), ("b", b"2"), ("c", b"3")])
        await storage.put_if_absent("jobs:q", "e", b"5", now=0.0, expires_at=10.0)
        await storage.apply("jobs:q", [("b", b"22"), ("d", b"4")], ["a", "c", "missing"])
        assert dict(await storage.scan("jobs:q")) == {"b": b"22", "d": b"4", "e": b"5"}
        await storage.apply("jobs:q", [("e", b"55")], [])
        assert await storage.put_if_absent("jobs:q", "e", b"x", now=100.0) is False  # no expiry
        await storage.apply("jobs:q", [], [])
        assert len(await storage.scan("jobs:q")) == 3

    async def test_put_many_last_duplicate_wins(self, storage: Storage) -> None:
        await storage.put_many("jobs:q", [("k", b"first"), ("x", b"x"), ("k", b"last")])
        assert await storage.get("jobs:q", "k") == b"last"
        assert sorted(await storage.scan("jobs:q")) == [("k", b"last"), ("x", b"x")]

    async def test_binary_values_survive_exactly(self, storage: Storage) -> None:
        values = {
            "nul": b"\x00",
            "nuls": b"a\x00b\x00\x00c\x00",
            "empty": b"",
            "all-bytes": bytes(range(256)) * 4,
            "not-utf8": b"\xff\xfe\xc3\x28\x80",
            "64k": bytes((i * 7919) % 256 for i in range(64 * 1024)),
        }
        for key, value in values.items():
            await storage.put("bin", key, value)
        for key, value in values.items():
            got = await storage.get("bin", key)
            assert type(got) is bytes
            assert got == value, key
        assert dict(await storage.scan("bin")) == values

    async def test_awkward_keys(self, storage: Storage) -> None:
        keys = [
            "a/b/c",
            "/leading",
            "q:job:1",
            "::",
            "with space",
            "ünïcödé-ключ-键-🔑",
            "*?[glob]",
            "quote'\"back\\slash",
            "x" * 200,
        ]
        for i, key in enumerate(keys):
            await storage.put("keys:ns/ü", key, str(i).encode())
        for i, key in enumerate(keys):
            assert await storage.get("keys:ns/ü", key) == str(i).encode(), key
        assert dict(await storage.scan("keys:ns/ü")) == {
            k: str(i).encode() for i, k in enumerate(keys)
        }
        await storage.delete("keys:ns/ü", "a/b/c")
        assert await storage.get("keys:ns/ü", "a/b/c") is None
        assert await storage.get("keys:ns/ü", "/leading") == b"1"

    async def test_scan_ten_thousand_entries(self, storage: Storage) -> None:
        expected = {f"job-{i:05d}": f"record {i}".encode() for i in range(10_000)}
        items = list(expected.items())
        for start in range(0, len(items), 1000):  # each call within the op timeout, loaded or not
            await storage.put_many("jobs:big", items[start:start + 1000])
        await storage.put("jobs:other", "job-00001", b"elsewhere")
        found = await storage.scan("jobs:big")
        assert len(found) == 10_000
        assert dict(found) == expected

    # -- put_if_absent ------------------------------------------------------------------------

    async def test_pia_absent_then_present(self, storage: Storage) -> None:
        assert await storage.put_if_absent("ledger", "k", b"first", now=NOW) is True
        assert await storage.put_if_absent("ledger", "k", b"second", now=NOW) is False
        assert await storage.get("ledger", "k") == b"first"

    async def test_pia_respects_plain_put(self, storage: Storage) -> None:
        await storage.put("ledger", "k", b"plain")
        assert await storage.put_if_absent("ledger", "k", b"x", now=1e18, expires_at=1e19) is False
        assert await storage.get("ledger", "k") == b"plain"

    async def test_pia_live_entry_blocks(self, storage: Storage) -> None:
        assert await storage.put_if_absent("ledger", "k", b"a", now=NOW, expires_at=NOW + 10)
        assert await storage.put_if_absent("ledger", "k", b"b", now=NOW + 9.5) is False
        assert await storage.get("ledger", "k") == b"a"

    async def test_pia_expired_entry_is_replaced(self, storage: Storage) -> None:
        assert await storage.put_if_absent("ledger", "k", b"a", now=NOW, expires_at=NOW + 10)
        assert await storage.put_if_absent("ledger", "k", b"b", now=NOW + 11, expires_at=NOW + 20)
        assert await storage.get("ledger", "k") == b"b"
        # The replacement carries its own expiry, not the old one.
        assert await storage.put_if_absent("ledger", "k", b"c", now=NOW + 15) is False
        assert await storage.put_if_absent("ledger", "k", b"d", now=NOW + 20) is True
        assert await storage.get("ledger", "k") == b"d"

    async def test_pia_expiry_boundary_is_exact(self, storage: Storage) -> None:
        # expires_at <= now counts as absent; a realistic epoch must not lose precision.
        exp = 1_700_000_000.123456
        assert await storage.put_if_absent("ledger", "k", b"a", now=NOW, expires_at=exp)
        just_before = math.nextafter(exp, -math.inf)
        assert await storage.put_if_absent("ledger", "k", b"b", now=just_before) is False
        assert await storage.put_if_absent("ledger", "k", b"c", now=exp) is True
        assert await storage.get("ledger", "k") == b"c"

    async def test_pia_none_never_expires(self, storage: Storage) -> None:
        assert await storage.put_if_absent("ledger", "k", b"a", now=NOW, expires_at=None)
        assert await storage.put_if_absent("ledger", "k", b"b", now=1e300) is False
        assert await storage.get("ledger", "k") == b"a"

    async def test_pia_expiry_replaced_by_none(self, storage: Storage) -> None:
        assert await storage.put_if_absent("ledger", "k", b"a", now=NOW, expires_at=NOW + 1)
        assert await storage.put_if_absent("ledger", "k", b"b", now=NOW + 2, expires_at=None)
        assert await storage.put_if_absent("ledger", "k", b"c", now=1e300) is False
        assert await storage.get("ledger", "k") == b"b"

    async def test_put_clears_expiry(self, storage: Storage) -> None:
        assert await storage.put_if_absent("ledger", "k", b"a", now=NOW, expires_at=NOW + 1)
        await storage.put("ledger", "k", b"permanent")
        assert await storage.put_if_absent("ledger", "k", b"x", now=NOW + 100) is False
        await storage.put_many("ledger", [("m", b"tmp")])
        assert await storage.put_if_absent("ledger", "n", b"a", now=NOW, expires_at=NOW + 1)
        await storage.put_many("ledger", [("n", b"permanent")])
        assert await storage.put_if_absent("ledger", "n", b"x", now=NOW + 100) is False
        assert await storage.get("ledger", "n") == b"permanent"

    async def test_delete_clears_expiry(self, storage: Storage) -> None:
        assert await storage.put_if_absent("ledger", "k", b"a", now=NOW, expires_at=NOW + 1)
        await storage.delete("ledger", "k")
        assert await storage.get("ledger", "k") is None
        # Written back with no expiry: must now be permanent, not inherit the deleted one's.
        await storage.put("ledger", "k", b"b")
        assert await storage.put_if_absent("ledger", "k", b"c", now=NOW + 100) is False

    async def test_pia_expiry_is_per_namespace(self, storage: Storage) -> None:
        assert await storage.put_if_absent("a", "k", b"a", now=NOW, expires_at=NOW + 1)
        assert await storage.put_if_absent("b", "k", b"b", now=NOW, expires_at=None)
        assert await storage.put_if_absent("b", "k", b"x", now=NOW + 5) is False
        assert await storage.put_if_absent("a", "k", b"y", now=NOW + 5) is True

    async def test_pia_visible_to_get_and_scan(self, storage: Storage) -> None:
        assert await storage.put_if_absent("ledger", "k", b"v", now=NOW, expires_at=NOW + 1)
        assert await storage.get("ledger", "k") == b"v"
        assert await storage.scan("ledger") == [("k", b"v")]

    # -- races --------------------------------------------------------------------------------

    async def test_concurrent_pia_exactly_one_wins(self, storage: Storage) -> None:
        results = await _race(
            [
                storage.put_if_absent("ledger", "hot", f"racer-{i}".encode(), now=NOW)
                for i in range(RACERS)
            ]
        )
        assert results.count(True) == 1
        winner = results.index(True)
        assert await storage.get("ledger", "hot") == f"racer-{winner}".encode()

    async def test_concurrent_pia_on_expired_entry_exactly_one_wins(self, storage: Storage) -> None:
        # The update branch (replace an expired entry) must be as atomic as the insert branch.
        assert await storage.put_if_absent("ledger", "hot", b"old", now=NOW, expires_at=NOW + 1)
        results = await _race(
            [
                storage.put_if_absent(
                    "ledger", "hot", f"racer-{i}".encode(), now=NOW + 5, expires_at=NOW + 60
                )
                for i in range(RACERS)
            ]
        )
        assert results.count(True) == 1
        assert await storage.get("ledger", "hot") == f"racer-{results.index(True)}".encode()

    async def test_concurrent_pia_across_instances(
        self, storage: Storage, make_storage: MakeStorage
    ) -> None:
        if not storage.shared:
            pytest.skip("adapter is not shared between instances")
        instances = [storage] + [await make_storage() for _ in range(4)]
        calls = [
            inst.put_if_absent("ledger", "hot", f"{n}-{i}".encode(), now=NOW)
            for n, inst in enumerate(instances)
            for i in range(RACERS // len(instances))
        ]
        results = await _race(calls)
        assert len(results) == RACERS
        assert results.count(True) == 1

    # -- durability ---------------------------------------------------------------------------

    async def test_data_survives_a_new_instance(
        self, storage: Storage, make_storage: MakeStorage
    ) -> None:
        if not storage.durable:
            pytest.skip("adapter is not durable")
        await storage.put("jobs:q", "j1", b"\x00record")
        await storage.put_many("jobs:q", [("j2", b"two"), ("j3", b"three")])
        assert await storage.put_if_absent("ledger", "live", b"L", now=NOW, expires_at=NOW + 10)
        assert await storage.put_if_absent("ledger", "dead", b"D", now=NOW, expires_at=NOW + 1)
        await storage.close()

        fresh = await make_storage()
        assert fresh is not storage
        assert await fresh.get("jobs:q", "j1") == b"\x00record"
        assert dict(await fresh.scan("jobs:q")) == {
            "j1": b"\x00record",
            "j2": b"two",
            "j3": b"three",
        }
        # Expiries are durable too.
        assert await fresh.put_if_absent("ledger", "live", b"x", now=NOW + 5) is False
        assert await fresh.put_if_absent("ledger", "dead", b"y", now=NOW + 5) is True

    # -- leader leases and fenced writes ------------------------------------------------------

    async def test_leader_lease_epochs_only_grow(self, storage: Storage) -> None:
        assert await storage.read_leader("q") is None
        assert await storage.acquire_leader("q", "a", now=NOW, ttl_s=5) == 1
        assert await storage.acquire_leader("q", "b", now=NOW + 1, ttl_s=5) is None  # live
        assert await storage.renew_leader("q", "a", 1, now=NOW + 4, ttl_s=5)
        assert await storage.acquire_leader("q", "b", now=NOW + 8, ttl_s=5) is None  # renewed
        lease = await storage.read_leader("q")
        assert lease is not None and (lease.holder, lease.epoch) == ("a", 1)
        assert lease.expires_at == NOW + 9
        assert await storage.acquire_leader("q", "b", now=NOW + 9, ttl_s=5) == 2  # expired
        assert not await storage.renew_leader("q", "a", 1, now=NOW + 9, ttl_s=5)
        assert await storage.acquire_leader("q", "c", now=NOW + 10, ttl_s=5,
                                            steal_from="b") == 3  # b is known to be gone
        await storage.release_leader("q", "b", 2)  # not b's any more: no effect
        assert await storage.acquire_leader("q", "a", now=NOW + 11, ttl_s=5) is None
        await storage.release_leader("q", "c", 3)  # a clean stop frees it at once
        assert await storage.acquire_leader("q", "a", now=NOW + 11, ttl_s=5) == 4
        assert await storage.acquire_leader("other", "a", now=NOW, ttl_s=5) == 1

    async def test_expired_lease_renews_while_nobody_took_it(self, storage: Storage) -> None:
        assert await storage.acquire_leader("q", "a", now=NOW, ttl_s=1) == 1
        assert await storage.renew_leader("q", "a", 1, now=NOW + 50, ttl_s=1)
        assert not await storage.renew_leader("q", "b", 1, now=NOW + 50, ttl_s=1)

    async def test_fenced_apply_writes_only_at_the_current_epoch(self, storage: Storage) -> None:
        assert await storage.acquire_leader("q", "a", now=NOW, ttl_s=5) == 1
        await storage.apply("jobs:q", [("j1", b"one")], [], fence=Fence("q", 1, "a"))
        assert await storage.get("jobs:q", "j1") == b"one"
        assert await storage.acquire_leader("q", "b", now=NOW + 6, ttl_s=5) == 2
        with pytest.raises(FencedOut):
            await storage.apply("jobs:q", [("j1", b"stale"), ("j2", b"two")], ["j1"],
                                fence=Fence("q", 1, "a"))
        assert dict(await storage.scan("jobs:q")) == {"j1": b"one"}  # nothing written
        with pytest.raises(FencedOut):
            await storage.apply("jobs:q", [("j3", b"x")], [], fence=Fence("never", 1, "a"))
        many = [(f"k{i}", bytes([i % 256]) * 3) for i in range(2500)]
        await storage.apply("jobs:q", many, ["j1"], fence=Fence("q", 2, "b"))
        stored = dict(await storage.scan("jobs:q"))
        assert len(stored) == 2500 and "j1" not in stored and stored["k7"] == b"\x07" * 3
        await storage.apply("jobs:q", [], [f"k{i}" for i in range(2400)],
                            fence=Fence("q", 2, "b"))
        assert len(await storage.scan("jobs:q")) == 100

    async def test_concurrent_acquire_has_one_winner(
        self, storage: Storage, make_storage: MakeStorage
    ) -> None:
        instances = [storage]
        if storage.shared:
            instances += [await make_storage() for _ in range(3)]
        for round_, now in enumerate((NOW, NOW + 100)):  # first leader, then after an expiry
            calls = [inst.acquire_leader("race", f"r{n}-{i}", now=now, ttl_s=10)
                     for n, inst in enumerate(instances) for i in range(RACERS // len(instances))]
            results = await asyncio.wait_for(asyncio.gather(*calls), RACE_TIMEOUT_S)
            winners = [r for r in results if r is not None]
            assert winners == [round_ + 1], results
