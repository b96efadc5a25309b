"""A pause that survives: ``pause``/``resume`` of a queue or one fairness group are stored
through the owner's storage, carry who and why, and outlast an owner restart (memory, Redis,
PostgreSQL, SQLite) and an HA failover. Real Zenoh for the app, the CLI and LiveQueue."""

from __future__ import annotations

import asyncio
import io
import json
from typing import Any

import msgpack
import pytest
import test_durable
from helpers import count, wait_events
from zenoh_util import isolated_configs, unique_prefix

from istos import ConfigError, Istos, MemoryStorage
from istos.core.groups import GroupLimits, Groups
from istos.core.heaps import JobHeaps
from istos.core.pauses import Pause, Pauses, pause_key
from istos.core.state import QueuePolicy, QueueState
from istos.ops import cli
from istos.ops.pause_view import add_pause_metrics, pause_lines
from istos.ops.render import stats_text
from istos.transport.local import LocalMesh
from istos_nb.views.livetables import stats_text as nb_stats_text

storage_factory = test_durable.storage_factory  # memory (durable), Redis, PostgreSQL, SQLite


# -- pure ------------------------------------------------------------------------------------
@pytest.mark.fast
def test_pause_record_round_trips_and_refuses_damaged_bytes():
    p = Pause(12.5, "ops@host", "smtp down", None)
    assert Pause.decode(p.encode()) == p
    g = Pause(1.0, None, None, "tenant-7")
    assert Pause.decode(g.encode()) == g and pause_key("tenant-7") == "group:tenant-7"
    for bad in (b"\xc1", msgpack.packb([1]), msgpack.packb({"at": "x"}),
                msgpack.packb({"at": 1.0, "reason": "r" * 501}),
                msgpack.packb({"at": 1.0, "group": ""}), msgpack.packb({"at": True})):
        assert Pause.decode(bad) is None


@pytest.mark.fast
def test_pauses_stats_shape():
    pauses = Pauses()
    assert pauses.stats() == {}
    pauses.put(Pause(2.0, "a", "why", None))
    pauses.put(Pause(3.0, "b", None, "g2"))
    pauses.put(Pause(1.0, "c", None, "g1"))
    out = pauses.stats()
    assert out["pause"]["reason"] == "why"
    assert out["paused_groups"]["count"] == 2
    assert [g["group"] for g in out["paused_groups"]["groups"]] == ["g1", "g2"]
    assert pauses.drop("g1") is not None and pauses.groups == {"g2"}
    assert pauses.drop(None) is not None and pauses.drop(None) is None


@pytest.mark.fast
def test_a_paused_group_is_skipped_by_the_rotation():
    state = QueueState("q", QueuePolicy())
    for i, grp in enumerate(["a", "b", "a", "b", None]):
        state.enqueue(f"j{i}", b"x", 0.0, group=grp)
    state.heaps.paused_groups.add("a")
    got = state.claim(["w0", "w1", "w2", "w3", "w4"], 1.0)
    assert sorted(r.job_id for r in got) == ["j1", "j3", "j4"]
    state.heaps.paused_groups.discard("a")
    assert sorted(r.job_id for r in state.claim(["w5", "w6"], 2.0)) == ["j0", "j2"]


@pytest.mark.fast
def test_groups_made_later_share_the_paused_set():
    heaps = JobHeaps({}, GroupLimits())
    heaps.paused_groups.add("x")
    assert heaps.grouped().paused is heaps.paused_groups
    assert Groups({}, GroupLimits()).paused == set()


@pytest.mark.fast
def test_pause_text_in_cli_notebook_and_metrics():
    stats = {"queue": "q", "node": "n", "counts": {"ready": 1}, "paused": True,
             "pause": {"at": 1.0, "by": "ops\x1b[31m@h", "reason": "smtp\ndown", "group": None},
             "paused_groups": {"count": 1, "groups": [{"at": 1.0, "by": None,
                                                       "reason": "noisy", "group": "t7"}]}}
    text = stats_text(stats)
    assert 'paused  by ops [31m@h "smtp down"' in text  # control characters blanked
    assert 'paused groups 1: t7 ("noisy")' in text
    assert 'PAUSED by ops [31m@h "smtp down"' in nb_stats_text(stats)
    assert pause_lines({"paused": True}) == ["  paused  (no reason given)"]

    class Family:
        def __init__(self) -> None:
            self.samples: list[tuple[list[str], float]] = []

        def add_metric(self, labels: list[str], value: float) -> None:
            self.samples.append((labels, value))

    info, groups = Family(), Family()
    add_pause_metrics("q", stats, info, groups)
    assert info.samples == [(["q", "ops [31m@h", "smtp down"], 1.0)]
    assert groups.samples == [(["q"], 1.0)]


def test_bad_pause_arguments_name_the_field_before_anything_is_sent():
    app = Istos(transport=LocalMesh().transport("p"))
    cases: list[tuple[dict[str, Any], str]] = [
        ({"reason": "r" * 501}, "reason"), ({"reason": 5}, "reason"),
        ({"by": "b" * 201}, "by"), ({"group": ""}, "group"), ({"group": 3}, "group")]
    for kw, field in cases:
        with pytest.raises(ConfigError, match=field):
            asyncio.run(app.pause("q", **kw))
    with pytest.raises(ConfigError, match="group"):
        asyncio.run(app.resume("q", group=""))


# -- in process, every storage -----------------------------------------------------------------
def _owner(mesh: LocalMesh, name: str, storage: Any) -> Istos:
    app = Istos(storage=storage, transport=mesh.transport(name), node_id=name)
    app.queue("q", admin=True)
    return app


async def _claim(app: Istos, slots: int = 10) -> list[str]:
    reply = await app.client("q").call("claim", workers=[f"t/{i}" for i in range(slots)],
                                       node="t")
    return [j["job_id"] for j in reply["jobs"]]


async def test_pause_survives_an_owner_restart_on_every_storage(storage_factory):
    mesh = LocalMesh()
    first = _owner(mesh, "owner-1", storage_factory())
    async with first.serving():
        pause = await first.pause("q", reason="smtp down", by="ops@host")
        assert pause["reason"] == "smtp down" and pause["by"] == "ops@host"
        await first.pause("q", reason="tenant 7 floods us", group="t7")
        await first.enqueue("q", 1, job_id="plain")
        await first.enqueue("q", 2, job_id="grouped", group="t7")
        assert await _claim(first) == []
        stats = first.owners["q"].stats()
        assert stats["paused"] and stats["pause"]["reason"] == "smtp down"
        assert stats["paused_groups"]["groups"][0]["group"] == "t7"
        events = first.events.recent()
        assert [e.detail.get("reason") for e in events if e.kind == "paused"] == \
            ["smtp down", "tenant 7 floods us"]
    second = _owner(mesh, "owner-2", storage_factory())
    async with second.serving():
        stats = second.owners["q"].stats()
        assert stats["paused"] and stats["pause"]["by"] == "ops@host"
        assert stats["paused_groups"]["count"] == 1
        assert await _claim(second) == []  # still paused after the restart
        why = (await second.client("q").call("why", job_id="grouped"))["why"]
        assert why["reason"].endswith("(claiming is paused)")
        assert await second.resume("q") is True
        why = (await second.client("q").call("why", job_id="grouped"))["why"]
        assert why["reason"].endswith("(its group is paused)")
        assert await second.resume("q") is False  # nothing to lift, nothing written
        assert await _claim(second) == ["plain"]  # the group t7 stays paused
        assert await second.resume("q", group="t7") is True
        assert await _claim(second) == ["grouped"]
    third = _owner(mesh, "owner-3", storage_factory())
    async with third.serving():
        stats = third.owners["q"].stats()
        assert not stats["paused"] and "pause" not in stats and "paused_groups" not in stats


async def test_pause_without_admin_is_refused_and_nothing_is_stored():
    from istos import AdminDisabled

    storage = MemoryStorage(durable=True, shared=True)
    app = Istos(storage=storage, transport=LocalMesh().transport("o"))
    app.queue("q")
    async with app.serving():
        with pytest.raises(AdminDisabled):
            await app.pause("q", reason="x")
        assert await storage.scan("pause:q") == []


async def test_pause_survives_an_ha_failover():
    mesh, storage = LocalMesh(), MemoryStorage(durable=True, shared=True)
    replicas = []
    for name in ("a", "b"):
        app = Istos(storage=storage, transport=mesh.transport(name), node_id=name,
                    request_timeout_s=1.0)
        app.queue("q", ha=True, ha_lease_s=0.6, sweep_interval_s=0.05, admin=True)
        replicas.append(app)
    a, b = replicas
    producer = Istos(transport=mesh.transport("p"), node_id="p", request_timeout_s=1.0)

    async def leader_is(app: Istos) -> None:
        async def loop() -> None:
            while not app.is_active_owner("q"):
                await asyncio.sleep(0.01)  # leadership is the election task's side effect
        await asyncio.wait_for(loop(), 10.0)

    await a.start()
    await leader_is(a)
    await b.start()
    try:
        async with producer.serving():
            assert (await producer.pause("q", reason="deploy"))["by"] == "p"
            await producer.enqueue("q", 1, job_id="j")
            await a.stop()  # a clean stop hands the leadership over at once
            await leader_is(b)
            stats = b.owners["q"].stats()
            assert stats["paused"] and stats["pause"]["reason"] == "deploy"
            assert await _claim(producer) == []
            assert await producer.resume("q")
            assert await _claim(producer) == ["j"]
    finally:
        await b.stop()
        await a.stop()


# -- real Zenoh: a remote app, the CLI and LiveQueue ------------------------------------------
async def test_pause_over_zenoh_from_app_cli_and_livequeue(tmp_path):
    from istos_nb import attach

    configs, prefix = isolated_configs(4), unique_prefix()
    storage = MemoryStorage(durable=True, shared=True)
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner", storage=storage)
    owner.queue("q", admin=True)
    remote = Istos(zenoh=configs[1], prefix=prefix, node_id="remote")
    runs: list[int] = []

    @remote.worker("q", poll_interval_s=0.2)
    async def handle(job: int) -> None:
        runs.append(job)

    def run_cli(*argv: str) -> dict[str, Any]:
        out = io.StringIO()
        args = cli.parser().parse_args([*argv, "--zenoh", json.dumps(configs[2]),
                                        "--prefix", prefix, "--json"])
        assert asyncio.run(cli.run(args, out)) == 0
        return dict(json.loads(out.getvalue()))

    async with owner.serving(), remote.serving():
        pause = await remote.pause("q", reason="smtp down")
        assert pause["by"] == "remote"
        await remote.enqueue("q", 7)
        assert (await asyncio.to_thread(run_cli, "pause", "q", "--reason", "still down",
                                        "--by", "alice"))["pause"]["by"] == "alice"
        stats = await asyncio.to_thread(run_cli, "stats", "q")
        row = stats[0] if isinstance(stats, list) else stats
        row = row.get("stats", row) if isinstance(row, dict) else row
        assert json.dumps(row).count("still down") == 1
        lq = await asyncio.to_thread(attach, "q", zenoh=configs[3], prefix=prefix)
        try:
            s = await asyncio.to_thread(lq.stats)
            assert s["paused"] and s["pause"]["reason"] == "still down"
            assert runs == []
            assert await lq.aresume() is True
        finally:
            await asyncio.to_thread(lq.close)
        await wait_events(owner, lambda ev: count(ev, "acked") == 1, 20.0)
        assert (await asyncio.to_thread(run_cli, "resume", "q"))["was"] is None
    assert runs == [7]


async def test_hostile_pause_requests_get_typed_errors_and_change_nothing():
    storage = MemoryStorage(durable=True, shared=True)
    app = Istos(storage=storage, transport=LocalMesh().transport("o"))
    app.queue("q", admin=True)
    async with app.serving():
        owner = app.owners["q"]
        for bad in ({"reason": "r" * 501}, {"reason": 3}, {"by": ["x"]}, {"group": ""},
                    {"group": "g" * 129}):
            reply = await owner.dispatch({"v": 1, "op": "pause", **bad}, role="admin")
            assert reply["ok"] is False and reply["error"] == "ProtocolError"
            assert next(iter(bad)) in reply["message"]
        assert not owner.state.paused and await storage.scan("pause:q") == []


async def test_a_pause_or_resume_during_a_storage_outage_changes_nothing(tmp_path):
    """Write, then apply: with the store down, pause and resume raise StorageUnavailable and
    the queue stays as storage holds it; once it is back, they go through."""
    from services import free_port, start_throwaway_redis

    from istos import RedisStoragePlugin, StorageUnavailable

    port = free_port()
    proc = start_throwaway_redis(port, str(tmp_path))
    try:
        app = Istos(storage=RedisStoragePlugin(f"redis://127.0.0.1:{port}/0", key_prefix="t",
                                               connect_timeout_s=0.3, op_timeout_s=0.3),
                    transport=LocalMesh().transport("o"), shutdown_grace_s=0.0)
        app.queue("q", admin=True)
        async with app.serving():
            owner = app.owners["q"]
            await app.pause("q", reason="before")
            proc.kill()
            proc.wait(5)
            with pytest.raises(StorageUnavailable):
                await app.resume("q")
            assert owner.state.paused and owner.stats()["pause"]["reason"] == "before"
            with pytest.raises(StorageUnavailable):
                await app.pause("q", reason="noisy", group="g")
            assert "paused_groups" not in owner.stats()
            proc = start_throwaway_redis(port, str(tmp_path))
            assert await app.resume("q") is True
            assert not owner.state.paused
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
