"""Trust at the wire (issue 11): sizes, schemas, leases, workflow meta, admin, fairness.

On the in-process mesh, with raw requests from a probe transport where the test plays a client
written from docs/protocol.md alone. The same checks over Zenoh, at volume: test_hostile.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import msgpack
import pytest
from helpers import count, wait_events

from istos import AdminDisabled, InvalidJob, Istos, codec, keys, protocol, schema
from istos.core import workflow_meta as wf
from istos.core.batch_state import batch_id
from istos.core.hungry import MAX_HUNGRY
from istos.owner.extension import Hooks
from istos.transport.local import LocalMesh

pytestmark = pytest.mark.fast  # `make check`: no process, server or session


@pytest.fixture
def mesh() -> LocalMesh:
    return LocalMesh()


def app_on(mesh: LocalMesh, name: str, **kw: Any) -> Istos:
    return Istos(transport=mesh.transport(name), **kw)


async def raw(probe: Any, queue: str, **msg: Any) -> dict[str, Any]:
    """One request as an outsider sends it: a msgpack map on the rpc key, reply decoded."""
    msg.setdefault("v", 1)
    key = keys.rpc_key("istos", queue, msg["op"]) if isinstance(msg.get("op"), str) \
        else f"istos/q/{queue}/rpc/read"
    reply = await probe.query(key, codec.encode_message(msg), 2.0)
    assert len(reply) <= protocol.FRAME_CAP
    return codec.decode_message(reply)


def assert_typed_error(reply: dict[str, Any], error: str | None = None) -> None:
    assert reply["v"] == 1 and reply["ok"] is False, reply
    assert reply["error"] in protocol.ERROR_CLASSES and isinstance(reply["message"], str)
    if error is not None:
        assert reply["error"] == error, reply


async def test_big_bodies_are_claimed_in_several_replies_and_none_dies(mesh):
    """Two 700 KB jobs and ten small ones, all claimable before the worker starts: each claim
    reply stays under the frame cap, so every job runs once and none is dead-lettered."""
    owner, worker = app_on(mesh, "owner"), app_on(mesh, "worker")
    owner.queue("q", max_attempts=1)
    seen: list[tuple[int, int]] = []

    @worker.worker("q", concurrency=12, poll_interval_s=600)  # a cut claim re-claims at once
    async def work(job: dict[str, Any]) -> None:
        seen.append((job["n"], len(job["pad"])))

    async with owner.serving():
        for n in range(12):
            await owner.enqueue("q", {"n": n, "pad": "x" * (700_000 if n < 2 else 10)})
        async with worker.serving():
            events = await wait_events(owner, lambda ev: count(ev, "acked") == 12)
    assert sorted(seen) == [(0, 700_000), (1, 700_000)] + [(n, 10) for n in range(2, 12)]
    assert count(events, "dead_lettered") == 0 and count(events, "lease_expired") == 0


async def test_a_body_at_the_limit_fits_a_claim_alone_and_a_bigger_one_is_refused(mesh):
    owner = app_on(mesh, "owner")
    owner.queue("q")
    probe = mesh.transport("probe")
    await probe.start()
    async with owner.serving():
        too_big = await raw(probe, "q", op="enqueue", job_id="big",
                            body=b"\x01" * (protocol.MAX_BODY_BYTES + 1))
        assert_typed_error(too_big, "InvalidJob")
        assert owner.owners["q"].state.jobs == {}  # nothing stored
        at_limit = b"\x02" * protocol.MAX_BODY_BYTES
        for job_id in ("max1", "max2"):
            assert (await raw(probe, "q", op="enqueue", job_id=job_id, body=at_limit))["ok"]
        assert (await raw(probe, "q", op="enqueue", job_id="small", body=b"\x03"))["ok"]
        long_slot = "s" * protocol.MAX_SLOT_ID_BYTES
        got = await raw(probe, "q", op="claim", workers=[long_slot, "b", "c"], node="n")
        assert [j["job_id"] for j in got["jobs"]] == ["max1"] and got["more"] is True
        assert got["jobs"][0]["body"] == at_limit
        got = await raw(probe, "q", op="claim", workers=["a", "b", "c"], node="n")
        assert [j["job_id"] for j in got["jobs"]] == ["max2", "small"] and "more" not in got


async def test_large_dead_letters_are_paged_until_complete(mesh):
    """Twelve dead jobs of 600 KB: every `dead` page fits a frame and dead_letters() on
    another node fetches them all."""
    owner, other = app_on(mesh, "owner"), app_on(mesh, "other")
    owner.queue("q", max_attempts=1)

    @owner.worker("q", concurrency=4)
    async def fail(job: dict[str, Any]) -> None:
        raise RuntimeError("no")

    probe = mesh.transport("probe")
    await probe.start()
    async with owner.serving(), other.serving():
        for n in range(12):
            await owner.enqueue("q", {"n": n, "pad": "y" * 600_000})
        await wait_events(owner, lambda ev: count(ev, "dead_lettered") == 12)
        dead = await other.dead_letters("q")
        assert sorted(d["data"]["n"] for d in dead) == list(range(12))
        assert all(len(d["data"]["pad"]) == 600_000 for d in dead)
        first = await raw(probe, "q", op="dead")
        assert 1 <= len(first["dead"]) < 12 and first["more"] is True and first["total"] == 12


async def test_deep_meta_is_refused_at_enqueue_and_claims_keep_working(mesh):
    owner = app_on(mesh, "owner")
    owner.queue("q")
    probe = mesh.transport("probe")
    await probe.start()
    deep: Any = 1
    for _ in range(1023):
        deep = {"k": deep}
    async with owner.serving():
        await owner.enqueue("q", {"ok": 1}, job_id="good")
        reply = await raw(probe, "q", op="enqueue", job_id="deep", body=b"\x01", meta=deep)
        assert_typed_error(reply, "InvalidJob")
        assert "deeper" in reply["message"]
        got = await raw(probe, "q", op="claim", workers=["a", "b"], node="n")
        assert [j["job_id"] for j in got["jobs"]] == ["good"]
        assert (await raw(probe, "q", op="why", job_id="deep"))["why"]["state"] == "unknown"


async def test_a_forged_ack_or_nack_is_stale_and_changes_nothing(mesh):
    """The old token was `{job_id}.{attempt}`, readable from `leases`: an outsider acked a
    running job with its own result. Tokens are random now and shown to the claimer only."""
    owner, worker = app_on(mesh, "owner"), app_on(mesh, "worker")
    owner.queue("q", keep_results=True, max_attempts=3)
    release, started = asyncio.Event(), asyncio.Event()

    @worker.worker("q")
    async def work(job: dict[str, Any]) -> dict[str, Any]:
        started.set()
        await release.wait()
        return {"by": "worker"}

    probe = mesh.transport("mallory")
    await probe.start()
    async with owner.serving(), worker.serving():
        jid = await owner.enqueue("q", {"n": 1})
        await asyncio.wait_for(started.wait(), 5)
        leases = (await raw(probe, "q", op="leases"))["leases"]
        assert [lease["job_id"] for lease in leases] == [jid]
        assert not any("token" in lease for lease in leases)
        events = [e.to_dict() for e in owner.events.recent()]
        token = owner.owners["q"].state.jobs[jid].lease_token
        assert token is not None and len(token) == 32
        assert token not in repr(events) and token not in repr(leases)
        for guess in (f"{jid}.1", f"{jid}.{leases[0]['attempt']}", "0" * 32):
            forged = await raw(probe, "q", op="ack", job_id=jid, token=guess,
                               result=codec.encode_body({"by": "mallory"}))
            assert forged["status"] == "stale"
            assert (await raw(probe, "q", op="nack", job_id=jid, token=guess,
                              error="x"))["status"] == "stale"
        rec = owner.owners["q"].state.jobs[jid]
        assert rec.state == "leased" and rec.attempts == 1 and rec.last_error is None
        release.set()
        await wait_events(owner, lambda ev: count(ev, "acked", jid) == 1)
        assert (await owner.result("q", jid))["result"] == {"by": "worker"}


@pytest.mark.parametrize("msg", [
    {"op": "enqueue", "job_id": ["a"], "body": b"x"},
    {"op": "enqueue", "job_id": "", "body": b"x"},
    {"op": "enqueue", "job_id": "a" * 1_000_000, "body": b"x"},
    {"op": "enqueue", "job_id": "a\x00b", "body": b"x"},
    {"op": "enqueue", "job_id": "ok", "body": b"x", "priority": 2 ** 63},
    {"op": "enqueue", "job_id": "ok", "body": b"x", "priority": True},
    {"op": "enqueue", "job_id": "ok", "body": b"x", "delay_s": float("nan")},
    {"op": "enqueue", "job_id": "ok", "body": "not bin"},
    {"op": "enqueue", "job_id": "ok", "body": b"x", "v": 1.0},
    {"op": "enqueue", "job_id": "ok", "body": b"x", "v": True},
    {"op": "settle", "items": [{"op": "frob", "job_id": "held", "token": "t"}]},
    {"op": "claim", "workers": [["nested"]]},
    {"op": "claim", "workers": []},
    {"op": "claim", "workers": ["s"] * (protocol.MAX_SLOTS + 1)},
    {"op": "jobs", "where": {".".join(["a"] * 50_000): 1}},
    {"op": "jobs", "limit": -1},
    {"op": "dead", "offset": "0"},
    {"op": 7},
])
async def test_malformed_requests_get_typed_errors_and_change_nothing(mesh, msg):
    owner = app_on(mesh, "owner")
    owner.queue("q")
    probe = mesh.transport("probe")
    await probe.start()
    async with owner.serving():
        await owner.enqueue("q", {"n": 1}, job_id="held")
        before = dict(owner.owners["q"].state.counts)
        assert_typed_error(await raw(probe, "q", **msg))
        assert owner.owners["q"].state.counts == before
        assert set(owner.owners["q"].state.jobs) == {"held"}
        assert (await raw(probe, "q", op="ping"))["ok"] is True


def test_every_op_the_owner_serves_has_a_role_key():
    assert set(protocol.SCHEMAS) == set(protocol.OP_ROLES)
    assert set(protocol.OP_ROLES.values()) == set(protocol.ROLES)
    assert {op for op, role in protocol.OP_ROLES.items() if role == "admin"} == \
        set(protocol.ADMIN_OPS)
    assert protocol.role_of("an_extension_op") == "admin"  # unknown: the narrowest grant


@pytest.mark.parametrize(("op", "fields", "wrong"), [
    ("claim", {"workers": ["s#0"], "node": "thief"}, "produce"),
    ("enqueue", {"job_id": "sneaked", "body": b"x"}, "work"),
    ("jobs", {}, "produce"),
    ("pause", {}, "read"),
])
async def test_an_op_on_another_roles_key_is_refused_and_changes_nothing(mesh, op, fields,
                                                                         wrong):
    owner = app_on(mesh, "owner")
    owner.queue("q", admin=True)
    probe = mesh.transport("probe")
    await probe.start()
    async with owner.serving():
        await owner.enqueue("q", {"n": 1}, job_id="held")
        before = dict(owner.owners["q"].state.counts)
        reply = codec.decode_message(await probe.query(
            f"istos/q/q/rpc/{wrong}", codec.encode_message({"v": 1, "op": op, **fields}), 2.0))
        assert_typed_error(reply, "ProtocolError")
        assert f"rpc/{protocol.role_of(op)}" in reply["message"]
        state = owner.owners["q"].state
        assert state.counts == before and set(state.jobs) == {"held"} and not state.paused
        # The same request on its own key goes through (claim: the held job is leased).
        right = await raw(probe, "q", op=op, **fields)
        assert right["ok"] is True, right
    await probe.close()


async def test_rejections_are_logged_once_per_peer_and_kind_per_interval(mesh, caplog):
    owner = app_on(mesh, "owner")
    owner.queue("q")
    probe = mesh.transport("probe")
    await probe.start()
    async with owner.serving():
        with caplog.at_level(logging.WARNING, logger="istos.owner"):
            for _ in range(500):
                await raw(probe, "q", op="enqueue", job_id=[1], body=b"x", node="mallory")
                await raw(probe, "q", op="frob", node="mallory")
    lines = [r for r in caplog.records if "rejected" in r.getMessage()]
    assert len(lines) == 2, [r.getMessage() for r in lines]


def test_reject_log_caps_lines_per_interval_whatever_the_peer_names():
    lines: list[str] = []
    rejects = protocol.RejectLog(lambda fmt, *args: lines.append(fmt % args), interval_s=10.0,
                                 max_lines=5)
    for i in range(1000):
        rejects.note(f"peer-{i}", "enqueue/ProtocolError", "bad", now=100.0 + i * 0.001)
    assert len(lines) == 5
    rejects.note("peer-x", "enqueue/ProtocolError", "bad", now=111.0)  # the next interval
    assert len(lines) == 6 and "995 similar suppressed" in lines[-1]


async def test_producer_supplied_workflow_meta_is_refused_at_enqueue(mesh):
    owner = app_on(mesh, "owner")
    owner.queue("q")
    owner.queue("cb")
    probe = mesh.transport("probe")
    await probe.start()
    forged_chord = {"chord": {"id": "c1", "index": 0, "size": 1, "callback": "cb",
                              "input": "evil"}}
    chain = {"chain": {"id": "k", "queues": ["q", "cb"], "step": 0, "priority": 0}}
    async with owner.serving():
        for job_id, meta in (("c1.0", forged_chord), ("x", {"anything": 1}),
                             ("x", {"chain": {"id": "k"}}), ("k.1", chain),
                             ("k.0", {**chain, "chord": forged_chord["chord"]})):
            reply = await raw(probe, "q", op="enqueue", job_id=job_id, body=b"\xc0", meta=meta)
            assert_typed_error(reply, "InvalidJob")
        assert owner.owners["q"].state.jobs == {}
        # The shapes the workflow code writes still pass: a chain step whose id derives from
        # its key, and a chord member once its barrier is open (its callback reserved).
        key = "ab" * 16
        cid = wf.chain_id(key, ["q", "cb"], 0)
        good = {"chain": {"id": cid, "queues": ["q", "cb"], "step": 0, "priority": 0,
                          "key": key}}
        assert (await raw(probe, "q", op="enqueue", job_id=f"{cid}.0", body=b"\xc0",
                          meta=good))["ok"]
        chord = wf.chord_id(key, "q", 1, "cb")
        member = {"chord": {"id": chord, "index": 0, "size": 1, "callback": "cb",
                            "input": None, "key": key}}
        assert_typed_error(await raw(probe, "q", op="chord_open", chord_id=chord, size=1,
                                     callback="cb", key=key), "InvalidJob")  # not reserved
        assert (await raw(probe, "cb", op="chord_reserve", chord_id=chord, member_queue="q", size=1,
                          key=key))["reserved"] is True
        assert (await raw(probe, "q", op="chord_open", chord_id=chord, size=1,
                          callback="cb", key=key))["opened"] is True
        assert (await raw(probe, "q", op="enqueue", job_id=f"{chord}.0", body=b"\xc0",
                          meta=member))["ok"]
        with pytest.raises(InvalidJob, match="not the id"):
            await owner.client("q").call("chord_open", chord_id=chord, size=2, callback="cb",
                                          key=key)


@pytest.mark.parametrize("op", ["requeue_dead", "requeue", "purge_dead", "pause", "resume",
                                "requeue_all_dead", "promote", "purge_dead_older"])
async def test_fate_changing_ops_need_admin_from_the_app_and_the_wire(mesh, op):
    owner = app_on(mesh, "owner")
    owner.queue("q", max_attempts=1)
    owner.queue("adm", max_attempts=1, admin=True)
    probe = mesh.transport("probe")
    await probe.start()
    fields: dict[str, Any] = {"job_id": "j"} if op in ("requeue_dead", "requeue") else \
        {"older_than_s": 60.0} if op == "purge_dead_older" else {}
    async with owner.serving():
        assert_typed_error(await raw(probe, "q", op=op, **fields), "AdminDisabled")
        with pytest.raises(AdminDisabled):
            await owner.client("q").call(op, **fields)
        if op == "requeue_dead":
            with pytest.raises(AdminDisabled):
                await owner.revive("q", "j")
        assert (await raw(probe, "adm", op=op, **fields))["ok"] is True


async def test_fake_empty_claims_neither_grow_memory_nor_take_real_workers_nudges(mesh):
    owner, worker = app_on(mesh, "owner"), app_on(mesh, "worker")
    owner.queue("q")
    ran: list[int] = []

    @worker.worker("q", poll_interval_s=600)  # only a nudge can wake it in time
    async def work(job: dict[str, Any]) -> None:
        ran.append(job["n"])

    probe = mesh.transport("probe")
    await probe.start()
    nudged: list[set[str]] = []
    async with owner.serving(), worker.serving():
        qowner = owner.owners["q"]
        qowner.extend(Hooks(on_nudge=lambda n, to: nudged.append(set(to))))
        await owner.enqueue("q", {"n": 0})
        await wait_events(owner, lambda ev: count(ev, "acked") == 1)
        for i in range(3 * MAX_HUNGRY):
            await raw(probe, "q", op="claim", workers=["s0", "s1"], node=f"fake-{i}")
        assert len(qowner.hungry) <= 2 * MAX_HUNGRY
        nudged.clear()
        await owner.enqueue("q", {"n": 1})
        await wait_events(owner, lambda ev: count(ev, "acked") == 2)
    assert ran == [0, 1] and worker.node.node_id in nudged[0]


def test_hungry_nodes_prefer_proven_workers_and_stay_bounded():
    from istos.core.hungry import HungryNodes

    hungry = HungryNodes()
    hungry.note_claim("real", 0, took=True, cut=False)  # it has taken a job before
    hungry.note_claim("real", 2, took=False, cut=False)  # ...and is idle now
    for i in range(5 * MAX_HUNGRY):
        hungry.note_claim(f"fake-{i}", 1, took=False, cut=False)
    assert len(hungry) == MAX_HUNGRY + 1
    assert hungry.take(1) == {"real"}  # not the oldest fakes
    assert hungry.take(2) == {f"fake-{4 * MAX_HUNGRY}", f"fake-{4 * MAX_HUNGRY + 1}"}
    hungry.note_claim("cut", 0, took=True, cut=True)
    assert hungry.take(0) == {"cut"} and hungry.take(0) == set()


KEY = "cd" * 16
CHORD = wf.chord_id(KEY, "q", 1, "q")
BATCH = batch_id(KEY, "q")


async def test_every_op_replies_with_the_fields_the_protocol_names(mesh):
    """protocol.REPLIES (and docs/protocol.md) against what an owner actually sends."""
    owner, worker = app_on(mesh, "owner"), app_on(mesh, "worker")
    owner.queue("q", max_attempts=1, admin=True, keep_results=True)

    @worker.worker("q")
    async def fail(job: Any) -> None:
        raise RuntimeError("dead")

    probe = mesh.transport("probe")
    await probe.start()
    async with owner.serving():
        async with worker.serving():
            await owner.enqueue("q", 1, job_id="d1")
            await wait_events(owner, lambda ev: count(ev, "dead_lettered") == 1)
        calls = {
            "ping": {}, "enqueue": {"body": b"\x01", "job_id": "j1"}, "stats": {},
            "claim": {"workers": ["s"], "node": "p"}, "settle": {"items": []},
            "unpark": {"workers": ["s"], "node": "p"},
            "ack": {"job_id": "x", "token": "t"}, "nack": {"job_id": "x", "token": "t"},
            "result": {"job_id": "d1"}, "dead": {}, "jobs": {}, "leases": {},
            "why": {"job_id": "j1"}, "events": {}, "follow": {}, "requeue": {"job_id": "d1"},
            "chord_reserve": {"chord_id": CHORD, "member_queue": "q", "size": 1, "key": KEY},
            "chord_open": {"chord_id": CHORD, "size": 1, "callback": "q", "key": KEY},
            "chord_expects": {"chord_id": CHORD},
            "requeue_dead": {"job_id": "d1"}, "purge_dead": {}, "pause": {}, "resume": {},
            "extend": {"items": []}, "release": {"items": []}, "cancel": {"job_id": "j1"},
            "enqueue_slot": {"body": b"\x02", "job_id": "sched:s:1", "period_s": 60.0},
            "enqueue_many": {"items": [{"body": b"\x03", "job_id": "m1", "priority": 2}]},
            "update": {"job_id": "j1", "priority": 1},
            "workers": {}, "requeue_all_dead": {"error": "dead"}, "promote": {},
            "purge_dead_older": {"older_than_s": 3600.0}, "states": {"job_ids": ["d1"]},
        }
        calls["resolve"] = {"prefix": "j1-no-such"}
        calls["series"] = {}
        calls["events_since"] = {"after": 0}
        calls["logs"] = {"job_id": "j1"}
        batch = {"batch_id": BATCH, "key": KEY}
        calls.update({
            "batch_reserve": {**batch, "kinds": ["on_success"]},
            "batch_open": {**batch, "callbacks": {"on_success": ["q", b"\xc0"]}},
            "batch_add": {**batch, "member": "b1", "member_queue": "q"},
            "batch_report": {**batch, "member": "b1", "outcome": "dead"},
            "batch_close": batch, "batch_status": {"batch_id": BATCH}, "batches": {},
            "batch_members": {"batch_id": BATCH},
            "dep_watch": {"job_id": "j1", "child_queue": "q", "child_id": "c1", "key": KEY},
            "dep_report": {"child_id": "c1", "parent_queue": "q", "parent_id": "j1",
                           "outcome": "done", "key": KEY}})
        assert set(calls) == set(protocol.SCHEMAS) == set(protocol.REPLIES)
        replies = {op: await raw(probe, "q", op=op, **fields) for op, fields in calls.items()}
    for op, reply in replies.items():
        always, sometimes = protocol.REPLIES[op]
        assert reply.pop("v") == 1 and reply.pop("ok") is True, (op, reply)
        assert always <= set(reply) <= always | sometimes, (op, sorted(reply))
    job = replies["claim"]["jobs"][0]
    assert tuple(job) == protocol.CLAIMED_JOB
    assert replies["result"]["state"] == "dead" and replies["requeue_dead"]["job_id"] == "d1"
    assert set(replies["leases"]["leases"][0]) == set(protocol.LEASE)
    assert set(replies["jobs"]["jobs"][0]) == set(protocol.JOB_SUMMARY)
    assert all(tuple(e) == protocol.EVENT for e in replies["events"]["events"])
    letter = replies["dead"]["dead"][0]
    assert tuple(letter) == protocol.DEAD_LETTER
    assert tuple(letter["history"][0]) == protocol.HISTORY_ENTRY


async def test_inspection_pages_are_bounded_by_bytes_and_count_and_say_more(mesh):
    owner = app_on(mesh, "owner")
    owner.queue("q")
    probe = mesh.transport("probe")
    await probe.start()
    async with owner.serving():
        for n in range(3):
            await owner.enqueue("q", {"n": n, "pad": "z" * 600_000}, job_id=f"big{n}")
        seen, offset = [], 0
        while True:
            page = await raw(probe, "q", op="jobs", offset=offset, limit=1000)
            assert len(page["jobs"]) >= 1
            seen += [j["job_id"] for j in page["jobs"]]
            offset = page["next_offset"]
            if not page["more"]:
                break
        assert seen == ["big0", "big1", "big2"] and offset == 3
        got = await raw(probe, "q", op="claim", workers=["a", "b", "c"], node="n")
        assert len(got["jobs"]) == 1 and got["more"] is True
        await raw(probe, "q", op="claim", workers=["a", "b"], node="n")
        leases = await raw(probe, "q", op="leases", limit=1)
        assert len(leases["leases"]) == 1 and leases["more"] is True
        assert (await raw(probe, "q", op="leases"))["more"] is False
        for i in range(protocol.MAX_EVENTS):
            await owner.enqueue("q", i, job_id=f"e{i}")
        events = await raw(probe, "q", op="events", limit=10 ** 6)
        assert len(events["events"]) == protocol.MAX_EVENTS and events["more"] is True
        assert events["events"][-1]["job_id"] == f"e{protocol.MAX_EVENTS - 1}"  # newest kept


def test_fast_paths_accept_only_what_the_schemas_accept():
    """The hot ops' fast paths (protocol.FAST) must never let through what the schema would
    refuse: checked on every message of the hostile generator, plus valid ones."""
    from test_hostile import SEED, generate

    valid = [
        {"op": "enqueue", "body": b"x", "job_id": "j", "delay_s": 1.5, "priority": -3},
        {"op": "enqueue", "body": b"x", "meta": None},
        {"op": "claim", "workers": ["n:f#0"], "settle": [
            {"op": "nack", "job_id": "j", "token": "ab12", "error": "boom"}]},
        {"op": "settle", "items": [{"op": "ack", "job_id": "j", "token": "t", "result": b""}]},
        {"op": "ack", "job_id": "j", "token": "t"}, {"op": "nack", "job_id": "j", "token": "t"},
        {"op": "enqueue_many", "items": [{"body": b"x", "job_id": "j", "delay_s": 0.5}]},
    ]
    accepted = 0
    for raw_msg in generate(SEED, 3000):
        try:
            msg = msgpack.unpackb(raw_msg, raw=False, strict_map_key=False)
        except Exception:
            continue
        if not isinstance(msg, dict) or not isinstance(msg.get("op"), str) \
                or msg["op"] not in protocol.FAST:
            continue
        if protocol.FAST[msg["op"]](msg):
            accepted += 1
            schema.check_fields(msg, protocol.SCHEMAS[msg["op"]])  # must not raise
    for msg in valid:
        assert protocol.FAST[msg["op"]](msg), msg
        schema.check_fields(msg, protocol.SCHEMAS[msg["op"]])
    assert accepted < 3000  # the generator's messages are malformed: few pass any fast path
