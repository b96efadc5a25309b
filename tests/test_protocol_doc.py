"""docs/protocol.md, tested as a client author would use it: a raw Zenoh client built from the
doc's tables alone (the role of each op, the ops' fields, the error names), against a real
owner over a private loopback mesh. Nothing here imports the request path of ``istos``; the
tables are parsed from the document, so a doc that drifts from the owner fails here.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgpack
import pytest
from test_outages import PrivateRedis
from zenoh_util import isolated_configs, unique_prefix

import istos.errors
from istos import Istos, RedisStoragePlugin, protocol
from istos.core import workflow_meta as wf
from istos.core.batch_state import batch_id
from istos.transport.base import NoResponder
from istos.transport.zenoh import ZenohTransport

DOC = (Path(__file__).parent.parent / "docs" / "protocol.md").read_text()
_ROW = re.compile(r"^\| `([a-z_]+)` \| (.*)$", re.M)


def section(title: str) -> str:
    start = DOC.index(title)
    nxt = DOC.find("\n## ", start + len(title))
    return DOC[start:nxt if nxt >= 0 else len(DOC)]


def role_table() -> dict[str, str]:
    """op -> role, from the "Role keys" table (the names before any parenthesis)."""
    out: dict[str, str] = {}
    for role in ("produce", "work", "read", "admin"):
        row = re.search(rf"^\| `{role}` \| (.*) \|$", DOC, re.M)
        assert row is not None, role
        for op in re.findall(r"`([a-z_]+)`", row.group(1).split("(")[0]):
            out[op] = role
    return out


def op_tables() -> dict[str, tuple[str, str]]:
    """op -> (request cell, reply cell) from the op tables of three sections."""
    out: dict[str, tuple[str, str]] = {}
    for title in ("## Producer and worker ops", "## Inspection ops", "## Bulk admin ops",
                  "## Admin ops"):
        for op, rest in _ROW.findall(section(title)):
            cells = [c.strip() for c in rest.rstrip("|").split(" | ")]
            if len(cells) >= 2:
                out[op] = (cells[0], cells[-1])
    return out


def error_table() -> dict[str, str]:
    """error name -> meaning, from the table under "Error names"."""
    part = DOC[DOC.index("Error names"):DOC.index("### Limits")]
    out: dict[str, str] = {}
    for names, meaning in re.findall(r"^\| (`[A-Za-z`, ]+`) \| (.*) \|$", part, re.M):
        for name in re.findall(r"`([A-Za-z]+)`", names):
            out[name] = meaning
    return out


ROLES, OPS, ERRORS = role_table(), op_tables(), error_table()


class DocClient:
    """Requests as docs/protocol.md's "Transport" section says: a get on the op's role key,
    the first ok reply, a retry while nobody answers yet."""

    def __init__(self, transport: ZenohTransport, prefix: str) -> None:
        self.transport, self.prefix = transport, prefix

    async def call(self, queue: str, op: str, **fields: Any) -> dict[str, Any]:
        key = f"{self.prefix}/q/{queue}/rpc/{ROLES[op]}"
        payload = msgpack.packb({"v": 1, "op": op, **fields}, use_bin_type=True)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15.0
        while True:
            try:
                raw = await self.transport.query(key, payload, 10.0)
                break
            except NoResponder:
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.01)
        reply = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        assert reply["v"] == 1 and isinstance(reply["ok"], bool), reply
        return dict(reply)

    async def ok(self, queue: str, op: str, **fields: Any) -> dict[str, Any]:
        reply = await self.call(queue, op, **fields)
        assert reply["ok"] is True, (op, reply)
        return reply

    async def error(self, queue: str, op: str, **fields: Any) -> str:
        reply = await self.call(queue, op, **fields)
        assert reply["ok"] is False and isinstance(reply["message"], str), (op, reply)
        assert reply["error"] in ERRORS, f"{reply['error']} is not in the doc's error table"
        return str(reply["error"])


@asynccontextmanager
async def served(**app_opts: Any) -> AsyncIterator[tuple[Istos, DocClient]]:
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner", **app_opts)
    owner.queue("q", admin=True, max_attempts=1, keep_results=True)
    owner.queue("plain")
    owner.queue("cb")
    transport = ZenohTransport(configs[1], node_id="doc-client")
    async with owner.serving():
        await transport.start()
        try:
            yield owner, DocClient(transport, prefix)
        finally:
            await transport.close()


def test_the_doc_tables_cover_every_op_the_owner_serves():
    assert set(OPS) == set(ROLES) == set(protocol.SCHEMAS)
    for op, role in ROLES.items():
        assert protocol.role_of(op) == role, op
    for op, (_, reply_cell) in OPS.items():
        for name in protocol.REPLIES[op][0]:
            assert re.search(rf"`{name}[`:]", reply_cell), \
                f"{op}: reply field {name} is not documented"


def test_every_documented_error_is_a_class_of_istos_errors():
    assert {"ProtocolError", "InvalidJob", "AdminDisabled", "StorageUnavailable",
            "InvalidProgress", "OwnerUnavailable", "OwnerConflict"} <= set(ERRORS)
    for name in ERRORS:
        assert issubclass(getattr(istos.errors, name), istos.errors.IstosError), name
    assert set(protocol.ERROR_CLASSES) <= set(ERRORS) | {"FencedOut"}


async def test_a_client_built_from_the_doc_exercises_every_op():
    key = "ef" * 16
    chord = wf.chord_id(key, "q", 1, "cb")
    chain = wf.chain_id(key, ["q"], 0)
    calls: list[tuple[str, dict[str, Any]]] = [
        ("ping", {}), ("stats", {}),
        ("enqueue", {"body": msgpack.packb({"n": 1}), "job_id": "j1"}),
        ("enqueue", {"body": b"\x90", "job_id": f"{chain}.0", "meta": {"chain": {
            "id": chain, "queues": ["q"], "step": 0, "priority": 0, "key": key}}}),
        ("enqueue_many", {"items": [{"body": b"\x01", "job_id": "m1", "priority": 2}]}),
        ("enqueue_slot", {"body": b"\x02", "job_id": "sched:s:1", "period_s": 60.0}),
        ("chord_reserve", {"chord_id": chord, "member_queue": "q", "size": 1, "key": key}),
        ("chord_open", {"chord_id": chord, "size": 1, "callback": "cb", "key": key}),
        ("chord_expects", {"chord_id": chord}),
        ("jobs", {"state": "ready", "where": {"n": 1}}), ("leases", {}), ("events", {}),
        ("why", {"job_id": "j1"}), ("result", {"job_id": "j1"}), ("follow", {"ttl_s": 5}),
        ("states", {"job_ids": ["j1", "nope"]}),
        ("enqueue", {"body": b"\x90", "job_id": "later", "delay_s": 3600}),
        ("promote", {"job_ids": ["later"]}),
        ("update", {"job_id": "j1", "priority": 0}),
    ]
    async with served() as (_, client):
        replies = {}
        for op, fields in calls:  # a chord's callback is reserved on the callback queue
            replies[op] = await client.ok("cb" if op == "chord_reserve" else "q", op, **fields)
        assert replies["jobs"]["jobs"][0]["job_id"] == "j1"
        assert replies["states"]["states"] == {"j1": "ready", "nope": "unknown"}
        assert replies["promote"]["promoted"] == 1
        claim = await client.ok("q", "claim", workers=["a", "b", "c", "d", "e"], node="n")
        held = {j["job_id"]: j["token"] for j in claim["jobs"]}
        assert "j1" in held and len(held) == 5  # j1, m1, the chain step, the slot, "later"
        lease = [{"job_id": j, "token": t} for j, t in held.items()]
        assert (await client.ok("q", "extend", items=[{**lease[0], "progress": 0.5}])
                )["statuses"] == ["ok"]
        assert (await client.ok("q", "release", items=[lease[1]]))["statuses"] == ["ok"]
        assert (await client.ok("q", "ack", **lease[0], result=b"\xc3"))["status"] == "ok"
        assert (await client.ok("q", "nack", **lease[2], error="boom"))["status"] == "ok"
        assert (await client.ok("q", "settle", items=[{"op": "ack", **lease[3]}])
                )["statuses"] == ["ok"]
        dead = await client.ok("q", "dead")
        assert dead["total"] == 1  # the chain step (priority, then FIFO): its key not shown
        assert dead["dead"][0]["meta"] == {"chain": {"id": chain, "queues": ["q"], "step": 0,
                                                     "priority": 0}}
        dead_id = dead["dead"][0]["job_id"]
        assert (await client.ok("q", "requeue", job_id=dead_id))["job_id"] != dead_id
        assert (await client.ok("q", "requeue_dead", job_id=dead_id))["status"] == "requeued"
        assert (await client.ok("q", "requeue_all_dead"))["requeued"] == 0
        assert (await client.ok("q", "purge_dead_older", older_than_s=3600))["purged"] == 0
        assert (await client.ok("q", "workers"))["total"] >= 1
        assert (await client.ok("q", "unpark", workers=["zz"], node="n"))["unparked"] == 0
        assert (await client.ok("q", "pause"))["paused"] is True
        assert (await client.ok("q", "resume"))["paused"] is False
        released = lease[1]["job_id"]  # ready again: cancelled at once
        assert (await client.ok("q", "cancel", job_id=released))["status"] == "cancelled"
        assert (await client.ok("q", "purge_dead"))["purged"] >= 0
        assert (await client.ok("q", "resolve", prefix="sched:s"))["matches"] == ["sched:s:1"]
        series = await client.ok("q", "series")
        assert series["rows"] and series["rows"][-1]["enqueued"] >= 0
        bid = batch_id(key, "q")
        batch = {"batch_id": bid, "key": key}
        assert (await client.ok("q", "batch_reserve", **batch, kinds=["on_success"])
                )["reserved"] is True
        assert (await client.ok("q", "batch_open", **batch, description="d", callbacks={
            "on_complete": ["q", b"\xc0"]}))["opened"] is True
        assert (await client.ok("q", "batch_add", **batch, member="bm", member_queue="q")
                )["added"] is True
        assert (await client.ok("q", "batch_report", **batch, member="bm", outcome="dead")
                )["status"] == "counted"
        assert (await client.ok("q", "batch_close", **batch))["closed"] is True
        status = (await client.ok("q", "batch_status", batch_id=bid))["batch"]
        assert (status["total"], status["dead"], status["pending"]) == (1, 1, 0)
        assert status["callbacks"]["on_complete"]["fired_at"] is not None
        assert (await client.ok("q", "batches"))["total"] == 1
        assert (await client.ok("q", "batch_members", batch_id=bid))["members"] == [
            {"job_id": "bm", "queue": "q", "state": "dead"}]
        dkey = "cd" * 16  # a child "dc" waiting for parent "dp" (docs/dependencies.md)
        assert (await client.ok("q", "enqueue", body=b"\xc0", job_id="dp"))["created"] is True
        assert (await client.ok("q", "dep_watch", job_id="dp", child_queue="q", child_id="dc",
                                key=dkey))["state"] == "pending"
        waits = {"deps": {"after": [["q", "dp"]], "o": ["pending"], "mode": "cancel",
                          "key": dkey}}
        assert (await client.ok("q", "enqueue", body=b"\xc0", job_id="dc", meta=waits)
                )["created"] is True
        assert (await client.ok("q", "states", job_ids=["dc"]))["states"]["dc"] == "waiting"
        assert (await client.ok("q", "dep_report", child_id="dc", parent_queue="q",
                                parent_id="dp", outcome="done", key=dkey))["status"] == "counted"
        assert (await client.ok("q", "states", job_ids=["dc"]))["states"]["dc"] == "ready"
        since = await client.ok("q", "events_since", epoch=None, after=0)
        assert since["events"] and len(since["seqs"]) == len(since["events"])
        logs = await client.ok("q", "logs", job_id="j1", after=0)
        assert logs["state"] in ("done", "cancelled", "unknown")
        assert logs["attempts"] == [] and logs["more"] is False
        exercised = {op for op, _ in calls} | {"claim", "extend", "release", "ack", "nack",
                                               "settle", "dead", "requeue", "requeue_dead",
                                               "pause", "resume", "cancel", "purge_dead",
                                               "requeue_all_dead", "purge_dead_older",
                                               "workers", "unpark", "resolve", "series",
                                               "events_since", "logs", "batch_reserve",
                                               "batch_open", "batch_add", "batch_report",
                                               "batch_close", "batch_status", "batches",
                                               "batch_members", "dep_watch", "dep_report"}
        assert exercised == set(OPS)


async def test_every_documented_error_a_request_can_get():
    async with served(request_timeout_s=0.5) as (_, client):
        assert await client.error("q", "ping", v=1.0) == "ProtocolError"  # v must be 1
        assert await client.error("q", "claim", workers=["s", "s"]) == "ProtocolError"
        assert await client.error("q", "enqueue", body=b"\x90", job_id="wf:x.1") == "InvalidJob"
        assert await client.error("plain", "pause") == "AdminDisabled"
        await client.ok("q", "enqueue", body=b"\x90", job_id="p")
        [job] = (await client.ok("q", "claim", workers=["s"]))["jobs"]
        assert await client.error("q", "extend", items=[{
            "job_id": "p", "token": job["token"], "progress": 2}]) == "InvalidProgress"
        key = "01" * 16  # a chord aimed at a queue nobody serves: its owner is unreachable
        chord = wf.chord_id(key, "q", 1, "nobody")
        assert await client.error("q", "chord_open", chord_id=chord, size=1,
                                  callback="nobody", key=key) == "OwnerUnavailable"
        # Silence, as documented: a key nobody serves gets no reply at all.
        with pytest.raises(NoResponder):
            await client.transport.query(f"{client.prefix}/q/nobody/rpc/read",
                                         msgpack.packb({"v": 1, "op": "ping"}), 1.0)


async def test_storage_unavailable_as_documented(tmp_path: Path):
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        storage = RedisStoragePlugin(server.url, key_prefix="doc", connect_timeout_s=0.3,
                                     op_timeout_s=0.3)
        async with served(storage=storage) as (_, client):
            await client.ok("q", "enqueue", body=b"\x90", job_id="before")
            server.kill()
            assert await client.error("q", "enqueue", body=b"\x90",
                                      job_id="during") == "StorageUnavailable"
            assert (await client.ok("q", "result", job_id="during"))["state"] == "unknown"
    finally:
        server.kill()
