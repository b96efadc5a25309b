"""The ``istos`` command line as a real subprocess, and ``istos metrics`` scraped over HTTP, against
live owners through a Zenoh router: owner and worker in client mode connected to a router-mode
session (standing in for ``zenohd``), the operator in client mode too, as production meshes run.
Also attach (LiveQueue) through the same router.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zenoh
from prometheus_client.parser import text_string_to_metric_families
from zenoh_util import free_port, router_configs, unique_prefix, wait_until

from istos import Istos, JobContext
from istos_nb import attach

REPO = Path(__file__).resolve().parents[1]


class Mesh:
    """A router session plus apps served on one background loop (the test thread stays free to
    run CLI subprocesses, which block)."""

    def __init__(self, n_clients: int = 4) -> None:
        router, self.clients = router_configs(n_clients)
        self.router = zenoh.open(zenoh.Config.from_json5(json.dumps(router)))
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.apps: list[Istos] = []

    def run(self, coro: Any, timeout_s: float = 15.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def serve(self, app: Istos) -> Istos:
        self.run(app.start())
        self.apps.append(app)
        return app

    def close(self) -> None:
        for app in reversed(self.apps):
            self.run(app.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.router.close()


EPOCH_FLOAT = re.compile(r"\b1\d{9}\.\d+|\b1\.\d+e\+?09\b")
"""Epoch seconds as a float: ``1764896122.5``, or ``1.7649e+09``."""


def cli(*args: str, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "istos", *args], capture_output=True, text=True,
                          timeout=timeout_s, env=env)


def wait_for(pred: Callable[[], bool], timeout_s: float = 10.0) -> None:
    done = threading.Event()
    for _ in range(int(timeout_s / 0.02)):
        if pred():
            return
        done.wait(0.02)
    raise AssertionError("condition not met in time")


@pytest.fixture
def mesh():
    m = Mesh()
    try:
        yield m
    finally:
        m.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_cli_on_a_live_owner_through_a_router(mesh):
    prefix = unique_prefix()
    owner = Istos(zenoh=mesh.clients[0], prefix=prefix, node_id="owner")
    # A long lease: on a loaded machine this test outlasts 30 s, and the held job must not
    # expire (max_attempts=1: it would dead-letter, and purge would find two).
    owner.queue("jobs/email", max_attempts=1, retry_backoff_s=0.5, admin=True, lease_s=600)
    owner.queue("plain")
    worker = Istos(zenoh=mesh.clients[1], prefix=prefix, node_id="wk")
    release = asyncio.Event()

    # heartbeat: the held job stays leased however long the CLI runs take on a loaded machine
    @worker.worker("jobs/email", concurrency=1, poll_interval_s=0.1, heartbeat=True)
    async def send(job: dict, ctx: JobContext) -> None:
        if job.get("fail"):
            raise RuntimeError("smtp down")
        await release.wait()

    mesh.serve(owner)
    dead_id = mesh.run(owner.enqueue("jobs/email", {"fail": True}, priority=9))
    held_id = mesh.run(owner.enqueue("jobs/email", {"to": "held"}, priority=5))
    ids = [mesh.run(owner.enqueue("jobs/email", {"to": f"u{i}@x"})) for i in range(4)]
    mesh.serve(worker)
    wait_for(lambda: owner.owners["jobs/email"].stats()["counts"]["leased"] == 1
             and owner.owners["jobs/email"].stats()["counts"]["dead"] == 1)
    common = ["--zenoh", json.dumps(mesh.clients[2]), "--prefix", prefix]

    out = cli("stats", "jobs/email", *common)
    assert out.returncode == 0, out.stderr
    assert "queue jobs/email on owner" in out.stdout and "admin" in out.stdout
    assert "ready 4" in out.stdout and "attempts 1" in out.stdout
    stats = json.loads(cli("stats", "jobs/email", "plain", *common, "--json").stdout)
    assert stats["jobs/email"]["counts"]["dead"] == 1 and stats["plain"]["admin"] is False
    assert stats["jobs/email"]["policy"]["retry_backoff_s"] == 0.5

    page = json.loads(cli("jobs", "jobs/email", "--state", "ready", "--limit", "2", *common,
                          "--json").stdout)
    assert len(page["jobs"]) == 2 and page["truncated"] is True and page["total"] == 4
    assert page["jobs"][0]["data"] == {"to": "u0@x"} and "body" not in page["jobs"][0]
    table = cli("jobs", "jobs/email", "--limit", "3", *common).stdout
    assert table.startswith("1–3 of 6 jobs\nJOB")
    # No epoch floats in a people table (as digits or in e-notation); "(1.7 s ago)" is an age.
    assert not EPOCH_FLOAT.search(table.split("\n", 2)[2]), table
    found = json.loads(cli("jobs", "jobs/email", "--where", "to=u2@x", *common,
                           "--json").stdout)
    assert [j["job_id"] for j in found["jobs"]] == [ids[2]] and found["total"] == 1

    why = cli("why", "jobs/email", held_id, *common)
    assert why.returncode == 0 and f"{held_id}: leased" in why.stdout
    assert "leased by wk:" in why.stdout
    assert "waiting behind" in json.loads(cli("why", "jobs/email", ids[3], *common,
                                              "--json").stdout)["reason"]
    dead = json.loads(cli("dead", "jobs/email", *common, "--json").stdout)["dead"]
    assert [d["job_id"] for d in dead] == [dead_id] and "smtp down" in dead[0]["last_error"]
    assert "smtp down" in cli("dead", "jobs/email", *common).stdout
    leases = cli("leases", "jobs/email", *common)
    assert held_id in leases.stdout and "wk:" in leases.stdout

    # follow: start it, then make an event happen; it prints that event as one JSON line.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    follower = subprocess.Popen([sys.executable, "-m", "istos", "follow", "jobs/email",
                                 "--count", "1", "--seconds", "30", *common, "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
    try:
        wait_for(lambda: _following(owner.owners["jobs/email"]), timeout_s=30)
        late = mesh.run(owner.enqueue("jobs/email", {"to": "late"}))
        line, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait(10)
    assert follower.returncode == 0, err
    event = json.loads(line.splitlines()[0])
    assert event["kind"] == "enqueued" and event["job_id"] == late

    # admin commands (this queue has admin=True)
    assert cli("pause", "jobs/email", *common).returncode == 0
    assert json.loads(cli("stats", "jobs/email", *common, "--json").stdout)[
        "jobs/email"]["paused"] is True
    assert cli("resume", "jobs/email", *common).stdout.strip() == "queue jobs/email resumed"
    resubmitted = json.loads(cli("resubmit", "jobs/email", dead_id, *common, "--json").stdout)
    assert resubmitted["job_id"] not in (dead_id, held_id, *ids)
    missing = cli("resubmit", "jobs/email", "no-such-job", *common)
    assert missing.returncode == 1 and "no dead job" in missing.stderr
    assert cli("purge-dead", "jobs/email", *common).returncode == 2  # ids or --all
    assert "purged 1" in cli("purge-dead", "jobs/email", "--all", *common).stdout
    cancelled = json.loads(cli("cancel", "jobs/email", ids[3], *common, "--json").stdout)
    assert cancelled == {"job_id": ids[3], "status": "cancelled"}
    assert "cancelling" in cli("cancel", "jobs/email", held_id, *common).stdout
    assert "too late" in cli("cancel", "jobs/email", ids[3], *common).stdout
    assert cli("cancel", "jobs/email", "no-such-job", *common).returncode == 1
    refused = cli("pause", "plain", *common)
    assert refused.returncode == 1 and "admin=True" in refused.stderr
    assert "Traceback" not in refused.stderr and refused.stderr.count("\n") == 1
    mesh.run(_set(release))


def _following(owner: Any) -> bool:
    # The owner publishes only once a follower asked (istos.owner.views.inspect.Inspector).
    follow = owner.handler("follow")
    return bool(follow.__self__._follow_until)


async def _set(event: asyncio.Event) -> None:
    event.set()


def test_cli_exit_codes_without_an_owner_and_on_bad_usage(mesh):
    common = ["--zenoh", json.dumps(mesh.clients[2]), "--prefix", unique_prefix(),
              "--timeout", "0.5"]
    nobody = cli("stats", "nobody", *common)
    assert nobody.returncode == 3 and nobody.stdout == ""
    assert nobody.stderr.startswith("istos: no owner of queue 'nobody'")
    assert nobody.stderr.count("\n") == 1 and "Traceback" not in nobody.stderr
    assert cli("jobs", "nobody", "--state", "bogus", *common).returncode == 2
    assert cli("why", "q").returncode == 2  # (`stats` without queues means every queue)
    bad = cli("stats", "q", "--zenoh", "/no/such/file.json5")
    assert bad.returncode == 2 and "not found" in bad.stderr and "Traceback" not in bad.stderr
    bad = cli("jobs", "q", "--where", "nokey", *common)
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr
    bad = cli("stats", "bad/*/name", *common)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert cli("follow", "q", "--seconds", "-1", *common).returncode == 2


def test_the_engine_cli_does_not_import_the_notebook_side():
    code = ("import sys, istos.ops.cli, istos.ops.metrics, istos.ops.operator\n"
            "import istos.ops.dashboard\n"
            "bad = [m for m in sys.modules if m.startswith(('istos_nb', 'pandas', 'ipywidgets'))]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30,
                   env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.timeout(120)
def test_metrics_scrape_parsed_by_prometheus_client(mesh):
    prefix = unique_prefix()
    owner = Istos(zenoh=mesh.clients[0], prefix=prefix, node_id="owner")
    owner.queue("a", max_attempts=1)
    owner.queue("b")

    @owner.worker("a", concurrency=1, poll_interval_s=0.1)
    async def work(job: dict, ctx: JobContext) -> None:
        if job["fail"]:
            raise RuntimeError("no")

    mesh.serve(owner)
    for i in range(5):
        mesh.run(owner.enqueue("a", {"fail": i == 0}))
    for _ in range(3):
        mesh.run(owner.enqueue("b", {}))
    wait_for(lambda: owner.owners["a"].stats()["counts"] == {
        "ready": 0, "delayed": 0, "leased": 0, "done": 0, "dead": 1,
        "cancelled": 0, "expired": 0, "waiting": 0})  # acked: not kept
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "istos", "metrics", "a", "b", "absent",
                             "--port", str(port), "--zenoh", json.dumps(mesh.clients[3]),
                             "--prefix", prefix, "--timeout", "1", "--budget", "5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        assert "/metrics" in proc.stdout.readline()  # printed once it listens
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read()
        samples = {}
        for family in text_string_to_metric_families(text.decode()):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
        assert samples[("istos_owner_up", (("queue", "a"),))] == 1.0
        assert samples[("istos_owner_up", (("queue", "absent"),))] == 0.0
        assert samples[("istos_jobs", (("queue", "a"), ("state", "dead")))] == 1.0
        assert samples[("istos_jobs", (("queue", "b"), ("state", "ready")))] == 3.0
        assert samples[("istos_enqueued_total", (("queue", "a"),))] == 5.0
        assert samples[("istos_acked_total", (("queue", "a"),))] == 4.0
        assert samples[("istos_nacked_total", (("queue", "a"),))] == 1.0
        assert samples[("istos_dead_lettered_total", (("queue", "a"),))] == 1.0
        assert samples[("istos_lease_expired_total", (("queue", "a"),))] == 0.0
        assert samples[("istos_oldest_ready_age_seconds", (("queue", "b"),))] > 0.0
        assert samples[("istos_paused", (("queue", "b"),))] == 0.0
        assert not any(k[1] == (("queue", "absent"),) for k in samples if k[0] != "istos_owner_up")
        # read-only: scraping consumed nothing
        assert owner.owners["b"].stats()["counts"]["ready"] == 3
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


async def test_attach_through_a_router_in_client_mode():
    router, clients = router_configs(3)
    session = zenoh.open(zenoh.Config.from_json5(json.dumps(router)))
    prefix = unique_prefix()
    try:
        owner = Istos(zenoh=clients[0], prefix=prefix, node_id="owner")
        owner.queue("q")
        worker = Istos(zenoh=clients[1], prefix=prefix, node_id="wk")
        done = asyncio.Event()

        @worker.worker("q", concurrency=1, poll_interval_s=0.1)
        async def work(job: dict, ctx: JobContext) -> None:
            done.set()

        async with owner.serving(), worker.serving():
            lq = attach("q", clients[2], prefix=prefix)
            try:
                lq.follow()
                await owner.enqueue("q", {"n": 1})
                await asyncio.wait_for(done.wait(), 10)
                await wait_until(lambda: bool((lq.events().kind == "acked").any()),
                                 timeout_s=10, what="the ack streamed through the router")
                assert lq.stats()["totals"]["acked"] == 1
            finally:
                lq.close()
    finally:
        session.close()


def test_cli_jobs_with_big_bodies_fetches_smaller_pages(mesh):
    prefix = unique_prefix()
    owner = Istos(zenoh=mesh.clients[0], prefix=prefix, node_id="owner")
    owner.queue("big")
    mesh.serve(owner)
    ids = [mesh.run(owner.enqueue("big", {"i": i, "blob": "y" * 600_000})) for i in range(3)]
    out = cli("jobs", "big", "--json", "--zenoh", json.dumps(mesh.clients[2]), "--prefix", prefix)
    assert out.returncode == 0, out.stderr
    page = json.loads(out.stdout)  # 1.8 MB of bodies: more than one message holds
    assert [j["job_id"] for j in page["jobs"]] == ids and page["truncated"] is False
