"""Security on the wire, tested: mutual TLS plus a Zenoh access-control allow-list.

The owner runs in its own OS process as a Zenoh router listening on ``tls/127.0.0.1:<port>``;
producer and worker are real Istos apps in client mode. Certificates come from
``docs/security/make-certs.sh`` and every node's config from the templates next to it, so the
shipped example is the one that is tested. Trusted nodes complete jobs; a session without a
certificate never gets a session to the router; a certificate signed by the same CA whose common
name is not on the allow-list connects, but none of its requests reach the owner.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import zenoh
from zenoh_util import free_port, unique_prefix

from istos import InvalidJob, Istos, JobContext, MeshUnreachable, OwnerUnavailable, codec
from istos.core import workflow_meta as wf

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs" / "security"
OWNER_PROC = str(Path(__file__).parent / "procs" / "zworker.py")
TEMPLATE_CERTS = "/etc/istos/certs"  # the placeholder directory the templates name

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI")


def make_certs(out: Path, *roles: str) -> None:
    """Run the documented script; it signs every role with one CA (CN = role name)."""
    subprocess.run(["sh", str(DOCS / "make-certs.sh"), str(out), *roles], check=True,
                   capture_output=True, timeout=30)


def load_template(name: str) -> dict[str, Any]:
    """A docs template as data. They are JSON5 whose only non-JSON parts are ``//`` lines."""
    lines = (DOCS / name).read_text().splitlines()
    return json.loads("\n".join(ln for ln in lines if not ln.lstrip().startswith("//")))


def instantiate(template: dict[str, Any], subs: dict[str, str]) -> dict[str, Any]:
    """Replace placeholders in every string of ``template``; each one must occur.

    A template that stops naming a placeholder fails here rather than being tested half-filled.
    """
    used: set[str] = set()

    def walk(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {k: walk(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [walk(v) for v in obj]
        if isinstance(obj, str):
            for old, new in subs.items():
                if old in obj:
                    used.add(old)
                    obj = obj.replace(old, new)
        return obj

    out = walk(template)
    assert used == set(subs), f"placeholders not in the template: {set(subs) - used}"
    return out


def tls(config: dict[str, Any]) -> dict[str, Any]:
    return config["transport"]["link"]["tls"]


@pytest.fixture
def mesh(tmp_path: Path) -> dict[str, Any]:
    """Certificates for router, worker, producer and the unlisted ``intruder`` and ``stranger``,
    and each node's config built from the docs templates."""
    certs = tmp_path / "certs"
    make_certs(certs, "router", "worker", "producer", "intruder", "stranger")
    port, prefix = free_port(), unique_prefix()
    endpoint = f"tls/127.0.0.1:{port}"
    common = {TEMPLATE_CERTS: str(certs)}
    router = instantiate(load_template("router.json5"),
                         {**common, "tls/0.0.0.0:7447": endpoint, "istos/**": f"{prefix}/**",
                          "istos/q/": f"{prefix}/q/", "istos/ev/": f"{prefix}/ev/"})
    clients = {role: instantiate(load_template(f"{role}.json5"),
                                 {**common, "tls/localhost:7447": endpoint})
               for role in ("worker", "producer")}
    # The intruder holds a certificate from the same CA, under a name the router does not list.
    intruder = copy.deepcopy(clients["producer"])
    tls(intruder).update(connect_certificate=str(certs / "intruder.pem"),
                         connect_private_key=str(certs / "intruder.key"))
    # No certificate at all: only the CA to check the router with.
    anonymous = copy.deepcopy(clients["producer"])
    tls(anonymous).update(enable_mtls=False)
    del tls(anonymous)["connect_certificate"], tls(anonymous)["connect_private_key"]
    return {"prefix": prefix, "certs": str(certs), "log": tmp_path / "owner.log", "router": router,
            "intruder": intruder, "anonymous": anonymous, **clients}


def test_docs_templates_parse_as_zenoh_configs():
    for name in ("router.json5", "worker.json5", "producer.json5"):
        zenoh.Config.from_file(str(DOCS / name))  # raises on anything Zenoh rejects


def test_make_certs_issues_ca_signed_role_certificates(tmp_path: Path):
    make_certs(tmp_path, "worker")
    make_certs(tmp_path, "late")  # the CA is kept: roles can be added later
    for role in ("worker", "late"):
        pem = str(tmp_path / f"{role}.pem")
        subject = subprocess.run(["openssl", "x509", "-in", pem, "-noout", "-subject"],
                                 check=True, capture_output=True, text=True).stdout
        assert subject.strip().replace(" ", "") == f"subject=CN={role}"
        subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.pem"), pem],
                       check=True, capture_output=True)


async def start_owner(config: dict[str, Any], prefix: str, log: Path,
                      queue: str = "q") -> subprocess.Popen[str]:
    """The owner of ``queue`` in its own process, a router with ``config``; READY-checked."""
    with log.open("w") as err:  # a file, not a pipe nobody drains
        proc = subprocess.Popen(
            [sys.executable, OWNER_PROC, json.dumps(config), prefix, queue, "owner"],
            stdout=subprocess.PIPE, stderr=err, text=True,
            env={**os.environ, "ISTOS_LEASE_S": "10"})
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 20)
    except BaseException:
        stop(proc)
        raise
    if line.strip() != "READY":
        stop(proc)
        raise AssertionError(f"owner did not start: {line!r} {log.read_text()[-2000:]}")
    return proc


def routers(app: Istos) -> list[str]:
    """Zenoh ids of the routers the app's client session is linked to."""
    session = app.node.transport._require_session()  # type: ignore[union-attr]
    return [str(z) for z in session.info.routers_zid()]


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


async def test_mtls_allow_list_admits_trusted_nodes_only(mesh: dict[str, Any]):
    prefix, n = mesh["prefix"], 20
    owner = await start_owner(mesh["router"], prefix, mesh["log"])
    try:
        done: dict[int, str] = {}
        stolen: list[Any] = []
        all_done = asyncio.Event()
        worker = Istos(zenoh=mesh["worker"], prefix=prefix, node_id="worker")

        @worker.worker("q", concurrency=4, poll_interval_s=0.2)
        async def work(job: dict, ctx: JobContext) -> None:
            done[job["i"]] = ctx.worker
            if len(done) + len(stolen) == n:
                all_done.set()

        # The intruder runs a worker too: it must never be handed a job.
        intruder = Istos(zenoh=mesh["intruder"], prefix=prefix, node_id="intruder",
                         request_timeout_s=0.5)

        @intruder.worker("q", poll_interval_s=0.2)
        async def steal(job: dict) -> None:
            stolen.append(job)
            if len(done) + len(stolen) == n:
                all_done.set()

        producer = Istos(zenoh=mesh["producer"], prefix=prefix, node_id="producer",
                         request_timeout_s=5.0)
        async with producer.serving(), worker.serving(), intruder.serving():
            for i in range(n):
                await producer.enqueue("q", {"i": i})
            await asyncio.wait_for(all_done.wait(), 20)

            # CA-signed but unlisted: its TLS link to the router is up (a client session opens
            # only then), yet nothing it sends reaches the owner.
            assert routers(intruder)
            with pytest.raises(OwnerUnavailable):
                await intruder.enqueue("q", {"from": "intruder"})
            with pytest.raises(OwnerUnavailable):
                await intruder.client("q").call("stats")
            stats = (await producer.client("q").call("stats"))["stats"]
        assert sorted(done) == list(range(n))
        assert all(w.startswith("worker") for w in done.values())
        assert stolen == []
        assert stats["totals"]["enqueued"] == n  # no job from the intruder was ever stored
        assert stats["totals"]["acked"] == n
    finally:
        stop(owner)


async def test_producers_cannot_claim_and_workers_cannot_pause(mesh: dict[str, Any]):
    """The allow-list grants requests by role key: a producer's certificate reaches enqueue and
    reads but not claims; a worker's reaches claims but not admin actions."""
    prefix = mesh["prefix"]
    owner = await start_owner(mesh["router"], prefix, mesh["log"])
    try:
        producer = Istos(zenoh=mesh["producer"], prefix=prefix, node_id="producer",
                         request_timeout_s=1.0)
        worker = Istos(zenoh=mesh["worker"], prefix=prefix, node_id="worker",
                       request_timeout_s=1.0)
        async with producer.serving(), worker.serving():
            jid = await producer.enqueue("q", {"for": "the worker"})
            with pytest.raises(OwnerUnavailable):  # the claim never reaches the owner
                await producer.client("q").call("claim", workers=["producer:x#0"],
                                                node="producer")
            with pytest.raises(OwnerUnavailable):
                await worker.client("q").call("pause")
            claimed = await worker.client("q").call("claim", workers=["worker:x#0"],
                                                    node="worker")
            assert [j["job_id"] for j in claimed["jobs"]] == [jid]
            job = claimed["jobs"][0]
            assert (await worker.client("q").call(
                "ack", job_id=jid, token=job["token"]))["status"] == "ok"
            stats = (await producer.client("q").call("stats"))["stats"]
        assert stats["totals"]["acked"] == 1 and not stats.get("paused")
    finally:
        stop(owner)


async def test_role_rules_hold_for_queue_names_of_any_depth(mesh: dict[str, Any]):
    """``jobs/email`` (two chunks, the protocol doc's example): the rules' ``**`` lets the
    producer enqueue and read and the worker claim and ack, and still keeps the producer from
    claiming, also through a key that ends in a role it holds."""
    prefix, queue = mesh["prefix"], "jobs/email"
    owner = await start_owner(mesh["router"], prefix, mesh["log"], queue=queue)
    try:
        producer = Istos(zenoh=mesh["producer"], prefix=prefix, node_id="producer",
                         request_timeout_s=5.0)
        worker = Istos(zenoh=mesh["worker"], prefix=prefix, node_id="worker",
                       request_timeout_s=5.0)
        async with producer.serving(), worker.serving():
            jid = await producer.enqueue(queue, {"to": "a@example.org"})
            assert (await producer.client(queue).call("stats"))["stats"]["counts"]["ready"] == 1
            transport = producer.node.transport
            assert transport is not None
            claim = codec.encode_message({"v": 1, "op": "claim", "workers": ["p#0"],
                                          "node": "producer"})
            # Allowed by the produce rule's key, refused by the owner: a malformed rpc key.
            sneaky = await transport.query(f"{prefix}/q/{queue}/rpc/work/rpc/produce", claim, 5.0)
            assert codec.decode_message(sneaky)["error"] == "ProtocolError"
            with pytest.raises(OwnerUnavailable):  # the work key: denied by the router
                await producer.client(queue).call("claim", workers=["p#0"], node="producer",
                                                  timeout_s=1.0)
            claimed = await worker.client(queue).call("claim", workers=["worker:x#0"],
                                                      node="worker")
            assert [j["job_id"] for j in claimed["jobs"]] == [jid]
            ack = await worker.client(queue).call("ack", job_id=jid,
                                                  token=claimed["jobs"][0]["token"])
            assert ack["status"] == "ok"
            stats = (await producer.client(queue).call("stats"))["stats"]
        assert stats["totals"]["acked"] == 1 and stats["counts"]["leased"] == 0
    finally:
        stop(owner)


async def test_a_chord_callback_goes_only_where_its_opener_may_enqueue(mesh: dict[str, Any]):
    """The confused deputy, closed by the router's rules: producers here may enqueue on ``q``
    only, so they can neither reserve a chord callback on ``victim`` nor make the owner of
    ``q`` fire one there; a chord whose callback stays on ``q`` completes."""
    prefix = mesh["prefix"]
    router = copy.deepcopy(mesh["router"])
    for rule in router["access_control"]["rules"]:
        if rule["id"] == "istos-produce":  # produce on q only; read everywhere
            rule["key_exprs"] = [f"{prefix}/q/q/rpc/produce", f"{prefix}/q/**/rpc/read"]
    owner = await start_owner(router, prefix, mesh["log"], queue="q,victim")
    try:
        producer = Istos(zenoh=mesh["producer"], prefix=prefix, node_id="producer",
                         request_timeout_s=1.0)
        worker = Istos(zenoh=mesh["worker"], prefix=prefix, node_id="worker")
        seen: list[Any] = []

        @worker.worker("q", poll_interval_s=0.1)
        async def member(data: Any) -> Any:
            seen.append(data)
            return data

        async with producer.serving(), worker.serving():
            with pytest.raises(OwnerUnavailable):  # chord_reserve on victim: denied
                await producer.chord("q", [1], callback=("victim", "x"))
            key = producer.node.ids.token()
            chord = wf.chord_id(key, "q", 1, "victim")
            with pytest.raises(InvalidJob, match="reservation"):  # the owner will not fire
                await producer.client("q").call("chord_open", chord_id=chord, size=1,
                                                callback="victim", key=key)
            ok = await producer.chord("q", [2], callback=("q", "y"))
            for _ in range(200):
                if {"results": [2], "input": "y"} in seen:
                    break
                await asyncio.sleep(0.05)
            victim = (await producer.client("victim").call("stats"))["stats"]
        assert {"results": [2], "input": "y"} in seen and ok.startswith("wf:")
        assert victim["totals"]["enqueued"] == 0
    finally:
        stop(owner)


async def test_listed_nodes_cannot_forge_the_owners_cancel_messages(mesh: dict[str, Any]):
    """Only the router (the owner) publishes on the queue's keys: a producer's forged cancel
    message never reaches the worker, whose run completes and is acked."""
    prefix = mesh["prefix"]
    owner = await start_owner(mesh["router"], prefix, mesh["log"])
    try:
        started, finish, heard = asyncio.Event(), asyncio.Event(), asyncio.Event()
        outcome: list[str] = []
        worker = Istos(zenoh=mesh["worker"], prefix=prefix, node_id="worker")

        @worker.worker("q", poll_interval_s=0.2)
        async def work(job: dict) -> None:
            started.set()
            try:
                await finish.wait()
            except asyncio.CancelledError:
                outcome.append("cancelled")
                raise
            outcome.append("done")

        @worker.subscribe("probe/after")
        async def after(data: Any) -> None:
            heard.set()

        producer = Istos(zenoh=mesh["producer"], prefix=prefix, node_id="producer",
                         request_timeout_s=5.0)
        async with producer.serving(), worker.serving():
            jid = await producer.enqueue("q", {"n": 1})
            await asyncio.wait_for(started.wait(), 20)
            transport = producer.node.transport
            assert transport is not None
            await transport.put(f"{prefix}/q/q/cancel", codec.encode_message(
                {"v": 1, "to": ["worker"], "jobs": [jid]}))
            # Puts from one session reach a subscriber in order: once an event published
            # after the forged message arrives, the forged one has arrived too, or never will.
            for _ in range(100):
                await producer.publish("probe/after", 1)
                try:
                    await asyncio.wait_for(heard.wait(), 0.2)
                    break
                except asyncio.TimeoutError:
                    continue
            assert heard.is_set(), "the worker never heard the producer's events"
            finish.set()
            for _ in range(100):
                stats = (await producer.client("q").call("stats"))["stats"]
                if stats["totals"]["acked"] == 1:
                    break
                await asyncio.sleep(0.1)
        assert outcome == ["done"]
        assert stats["totals"]["acked"] == 1 and stats["totals"].get("nacked", 0) == 0
    finally:
        stop(owner)


async def test_sessions_without_a_certificate_get_nothing(mesh: dict[str, Any]):
    prefix = mesh["prefix"]
    owner = await start_owner(mesh["router"], prefix, mesh["log"])
    try:
        # As a client (the documented shape) it cannot even open a session: mTLS refuses it.
        client = Istos(zenoh=mesh["anonymous"], prefix=prefix, node_id="anon-client")
        with pytest.raises(MeshUnreachable, match="certificate"):
            await asyncio.wait_for(client.start(), 20)
        # As a peer the session opens, alone; its requests find no owner.
        peer = Istos(zenoh={**mesh["anonymous"], "mode": "peer"}, prefix=prefix,
                     node_id="anon-peer", request_timeout_s=0.5)
        async with peer.serving():
            with pytest.raises(OwnerUnavailable):
                await peer.enqueue("q", {"from": "anonymous"})
        # The trusted producer still works, and sees that nothing arrived.
        producer = Istos(zenoh=mesh["producer"], prefix=prefix, node_id="producer")
        async with producer.serving():
            stats = (await producer.client("q").call("stats"))["stats"]
        assert stats["totals"]["enqueued"] == 0
    finally:
        stop(owner)


async def test_a_deny_list_only_blocks_the_names_it_lists(mesh: dict[str, Any]):
    """Why the docs ship an allow-list: deny "intruder", and any other CA-signed name gets in."""
    router = copy.deepcopy(mesh["router"])
    acl = router["access_control"]
    prefix = mesh["prefix"]
    every = sorted({m for rule in acl["rules"] for m in rule["messages"]})
    acl["default_permission"] = "allow"
    acl["rules"] = [{"id": "deny-intruder", "permission": "deny", "flows": ["ingress", "egress"],
                     "messages": every, "key_exprs": [f"{prefix}/**"]}]
    acl["subjects"] = [{"id": "intruders", "cert_common_names": ["intruder"]}]
    acl["policies"] = [{"rules": ["deny-intruder"], "subjects": ["intruders"]}]
    owner = await start_owner(router, prefix, mesh["log"])
    try:
        stranger = copy.deepcopy(mesh["intruder"])
        tls(stranger).update(connect_certificate=mesh["certs"] + "/stranger.pem",
                             connect_private_key=mesh["certs"] + "/stranger.key")
        named = Istos(zenoh=mesh["intruder"], prefix=prefix, node_id="intruder",
                      request_timeout_s=0.5)
        other = Istos(zenoh=stranger, prefix=prefix, node_id="stranger", request_timeout_s=5.0)
        async with named.serving(), other.serving():
            with pytest.raises(OwnerUnavailable):
                await named.enqueue("q", {"from": "intruder"})
            await other.enqueue("q", {"from": "stranger"})  # accepted: nobody named it
            stats = (await other.client("q").call("stats"))["stats"]
        assert stats["totals"]["enqueued"] == 1
    finally:
        stop(owner)
