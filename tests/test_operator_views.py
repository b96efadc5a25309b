"""What an operator sees and does beyond counts (issue 26), on real Zenoh: tracebacks kept with
failed attempts, kept results in ``why``, the owner's workers table, bulk admin actions, and
``jobs`` searches by error, worker and time, through the ``istos`` CLI (a real subprocess),
the Operator session and LiveQueue."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from zenoh_util import free_port, isolated_configs, peer_config, unique_prefix, wait_until

from istos import Istos, JobContext, codec, protocol
from istos.core.records import QueuePolicy
from istos.core.state import QueueState
from istos.ops.operator import Operator
from istos.owner.handlers.job_ops import dead_letter
from istos_nb import aattach

REPO = Path(__file__).resolve().parents[1]
WAIT_S = 60.0  # generous: the machine is shared


def cli_config(configs: list[dict[str, Any]]) -> str:
    """A peer of its own for one CLI run, connected to every peer of the mesh but the last
    (the test's own Operator or LiveQueue: peers route nothing for others)."""
    peers = [c["listen"]["endpoints"][0] for c in configs[:-1]]
    return json.dumps(peer_config(f"tcp/127.0.0.1:{free_port()}", peers))


async def cli(configs: list[dict[str, Any]], prefix: str, *args: str
              ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "istos", *args, "--zenoh", cli_config(configs),
           "--prefix", prefix, "--timeout", "20"]
    return await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True,
                                   timeout=120, env=env)


def deep_failure(n: int) -> None:
    raise ValueError(f"boom {n}")


async def test_tracebacks_results_and_the_workers_table_over_zenoh():
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q", max_attempts=2, retry_backoff_s=0.01, retry_backoff_max_s=0.01,
                keep_results=True, admin=True)
    worker = Istos(zenoh=configs[1], prefix=prefix, node_id="wk")
    release = asyncio.Event()

    @worker.worker("q", concurrency=2, prefetch=0, heartbeat=True)
    async def handle(job: dict[str, Any], ctx: JobContext) -> Any:
        if job.get("fail"):
            deep_failure(ctx.attempt)
        if job.get("hold"):
            await release.wait()
        return {"echo": job["n"]}

    async with owner.serving(), worker.serving():
        q = owner.owners["q"]
        dead_id = await owner.enqueue("q", {"fail": True, "n": 0})
        done_id = await owner.enqueue("q", {"n": 1})
        await wait_until(lambda: q.stats()["counts"]["dead"] == 1
                         and q.stats()["counts"]["done"] == 1, WAIT_S, "dead and done")
        held_id = await owner.enqueue("q", {"hold": True, "n": 2})
        await wait_until(lambda: q.stats()["counts"]["leased"] == 1, WAIT_S, "held")

        async with Operator(configs[2], prefix=prefix, timeout_s=20) as op:
            why = (await op.call("q", "why", job_id=dead_id))["why"]
            history = why["dead_letter"]["history"]
            assert [a["outcome"] for a in history] == ["nacked", "nacked"]
            for attempt, entry in enumerate(history, start=1):
                assert entry["error"] == f"ValueError: boom {attempt}"
                assert "in deep_failure" in entry["traceback"]
                assert entry["traceback"].rstrip().endswith(f"ValueError: boom {attempt}")
            done = (await op.call("q", "why", job_id=done_id))["why"]
            assert done["state"] == "done" and done["result_size"] > 0
            assert codec.decode_body(done["result"]) == {"echo": 1}

            rows = await op.workers("q")
            assert [r["worker"] for r in rows] == ["wk:handle"]
            row = rows[0]
            assert (row["node"], row["concurrency"], row["prefetch"], row["slots"],
                    row["heartbeat"]) == ("wk", 2, 0, 2, True)
            assert row["held"] == [held_id] and row["held_count"] == 1
            assert (row["claimed"], row["acked"], row["nacked"], row["expired"]) == (4, 1, 2, 0)
            assert row["first_seen"] <= row["last_seen"] <= op.now() + 1

        out = await cli(configs, prefix, "why", "q", dead_id)
        assert out.returncode == 0, out.stderr
        assert "traceback of the last failed attempt:" in out.stdout
        assert "in deep_failure" in out.stdout and "ValueError: boom 2" in out.stdout
        out = await cli(configs, prefix, "why", "q", done_id)
        assert out.returncode == 0 and 'result: {"echo":1}' in out.stdout, out.stdout
        out = await cli(configs, prefix, "workers", "q")
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("queue q\nWORKER") and "wk:handle" in out.stdout
        assert "2+0 hb" in out.stdout and f"1 ({held_id})" in out.stdout
        table = json.loads((await cli(configs, prefix, "workers", "q", "--json")).stdout)
        assert table["q"][0]["acked"] == 1 and table["q"][0]["held"] == [held_id]

        dead = await owner.dead_letters("q")
        assert "ValueError: boom 2" in dead[0]["traceback"]
        lq = await aattach("q", configs[2], prefix=prefix, timeout_s=20)
        try:
            frame = await lq.adead_letters()
            assert "in deep_failure" in frame.traceback[0]
            workers = await lq.aworkers()
            assert list(workers.worker) == ["wk:handle"] and int(workers.acked[0]) == 1
            assert bool(workers.heartbeat[0]) and workers.held[0] == [held_id]
            why = await lq.awhy(done_id)
            assert why["result"] == {"echo": 1}
        finally:
            await lq.aclose()
        release.set()
        await wait_until(lambda: q.stats()["counts"]["done"] == 2, WAIT_S, "released job done")


@pytest.mark.slow
async def test_bulk_admin_actions_and_searches_over_zenoh():
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q", max_attempts=1, admin=True)
    owner.queue("plain", max_attempts=1)
    worker = Istos(zenoh=configs[1], prefix=prefix, node_id="wk")

    @worker.worker("q", concurrency=4)
    async def send(job: dict[str, Any]) -> None:
        raise RuntimeError(job["why"])

    async with owner.serving():
        q = owner.owners["q"]
        before = q.node.clock.now()
        async with worker.serving():
            for i in range(6):
                await owner.enqueue("q", {"why": "smtp down" if i < 4 else "dns fail", "n": i})
            await wait_until(lambda: q.stats()["counts"]["dead"] == 6, WAIT_S, "six dead")
        late = [await owner.enqueue("q", {"n": 10 + i}, delay_s=3600) for i in range(3)]
        await owner.enqueue("plain", {"n": 0})

        async with Operator(configs[2], prefix=prefix, timeout_s=20) as op:
            rows, total, _ = await op.jobs("q", "dead", filters={"error": "dns"})
            assert sorted(r["body"] for r in rows) == sorted(
                r.body for r in q.state.dead.values() if "dns" in (r.last_error or ""))
            assert total == 2
            assert len((await op.jobs("q", None, filters={"worker": "wk:send"}))[0]) == 6
            assert (await op.jobs("q", None, filters={"worker": "nobody"}))[0] == []
            assert len((await op.jobs("q", None, filters={"enqueued_after": before}))[0]) == 9
            assert (await op.jobs("q", None, filters={"enqueued_before": before - 1}))[0] == []
            assert len((await op.jobs("q", None, filters={
                "finished_after": before, "finished_before": op.now() + 1}))[0]) == 6
            # One bulk request is bounded: a limit of 1 moves one and says more remain.
            one = await op.call("q", "requeue_all_dead", error="smtp", limit=1)
            assert one == {"requeued": 1, "more": True, "ok": True, "v": 1}

        out = await cli(configs, prefix, "jobs", "q", "--state", "dead", "--error", "smtp",
                        "--json")
        assert out.returncode == 0 and len(json.loads(out.stdout)["jobs"]) == 3, out.stderr
        out = await cli(configs, prefix, "jobs", "q", "--enqueued-after", "1h", "--json")
        assert len(json.loads(out.stdout)["jobs"]) == 9
        out = await cli(configs, prefix, "redrive-dead", "q", "--error", "smtp")
        assert out.returncode == 0 and out.stdout.strip() == "3 dead letter(s) back to ready"
        counts = q.stats()["counts"]
        assert (counts["ready"], counts["dead"], counts["delayed"]) == (4, 2, 3)
        assert all(q.state.jobs[j].attempts == 0 for j in q.state.jobs
                   if q.state.jobs[j].state == "ready")
        assert (await cli(configs, prefix, "requeue-dead", "q")).returncode == 2
        refused = await cli(configs, prefix, "requeue-dead", "plain", "--all")
        assert refused.returncode == 1 and "admin=True" in refused.stderr

        out = await cli(configs, prefix, "promote", "q", late[0])
        assert out.stdout.strip() == "promoted 1 delayed job(s) to ready"
        assert q.state.jobs[late[0]].state == "ready"
        out = await cli(configs, prefix, "purge-dead", "q", "--older-than", "1h")
        assert out.stdout.strip() == "purged 0 dead letter(s) older than 1.0 h"
        assert (await cli(configs, prefix, "purge-dead", "q", "--older-than", "soon")
                ).returncode == 2

        lq = await aattach("q", configs[2], prefix=prefix, timeout_s=20)
        try:
            assert await lq.apromote() == 2
            assert q.stats()["counts"]["delayed"] == 0 and q.stats()["counts"]["ready"] == 7
            found = await lq.ajobs("ready", error="smtp")
            assert found.empty  # revived jobs start afresh: no last error
            assert len(await lq.ajobs("dead", worker="wk:")) == 2
            assert len(await lq.ajobs(enqueued=(before, None))) == 9
            assert await lq.apurge_dead(older_than_s=0) == 2
            assert await lq.aredrive_dead() == 0
            with pytest.warns(DeprecationWarning, match="LiveQueue.aredrive_dead"):
                assert await lq.arequeue_dead() == 0  # the old name, kept one release
            with pytest.raises(ValueError, match="after, before"):
                await lq.ajobs(enqueued=before)
        finally:
            await lq.aclose()
        assert q.stats()["counts"]["dead"] == 0


def test_a_long_traceback_keeps_its_innermost_frames_and_fits_its_cap():
    frames = "".join(f'  File "m.py", line {i}, in f{i}\n    f{i + 1}()\n' for i in range(2000))
    text = "Traceback (most recent call last):\n" + frames + "ValueError: the real cause\n"
    kept = protocol.clip_traceback(text)
    assert kept is not None and len(kept.encode()) <= protocol.MAX_TRACEBACK_BYTES
    assert kept.startswith("... (") and "bytes of outer frames cut)\n  File" in kept
    assert kept.endswith("ValueError: the real cause\n") and "in f1999" in kept
    assert "in f0\n" not in kept
    assert protocol.clip_traceback("short\n") == "short\n"
    assert protocol.clip_traceback("") is None and protocol.clip_traceback(None) is None


def test_only_the_newest_failed_attempts_keep_tracebacks_and_a_dead_letter_fits_a_frame():
    import random

    policy = QueuePolicy(max_attempts=30, history_limit=20)
    state = QueueState("q", policy)
    body = b"\x00" * protocol.MAX_BODY_BYTES
    state.enqueue("j", body, 0.0, meta={"k": "x" * (protocol.MAX_META_BYTES - 64)})
    tb = protocol.clip_traceback("T" * (1 << 20))
    for attempt in range(1, 31):
        now = float(attempt)
        (rec,) = state.claim([f"w{'x' * 200}#0"], now)
        assert rec.lease_token is not None
        state.nack("j", rec.lease_token, now, protocol.clip_error("e" * 5000),
                   random.Random(1), tb)
        state.promote("j", now)  # no waiting out the backoff
    rec = state.jobs["j"]
    assert rec.state == "dead" and len(rec.history) == 20
    assert [a.traceback is not None for a in rec.history] == [False] * 18 + [True] * 2
    assert protocol.encoded_size({"dead": [dead_letter(rec)], "total": 1, "more": False,
                                  "next_offset": 1}) <= protocol.FRAME_CAP


async def test_wait_and_run_distributions_in_stats_and_metrics_over_zenoh():
    from prometheus_client.parser import text_string_to_metric_families

    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("a", max_attempts=1)
    worker = Istos(zenoh=configs[1], prefix=prefix, node_id="wk")

    @worker.worker("a", concurrency=1)
    async def work(job: dict[str, Any]) -> None:
        await asyncio.sleep(job["sleep"])  # the work itself: run times of at least this
        if job["fail"]:
            raise RuntimeError("no")

    async with owner.serving():
        for i in range(5):
            await owner.enqueue("a", {"fail": i == 0, "sleep": 0.3 if i == 4 else 0.0})
        async with worker.serving():
            await wait_until(lambda: owner.owners["a"].stats()["counts"]["dead"] == 1
                             and owner.owners["a"].state.counts["ready"] == 0
                             and owner.owners["a"].state.counts["leased"] == 0, WAIT_S)
            async with Operator(configs[2], prefix=prefix, timeout_s=20) as op:
                stats = await op.stats("a")
            assert stats["wait_s"]["n"] == 5 and stats["run_s"]["n"] == 5
            assert stats["run_s"]["p99"] >= 0.3 > stats["run_s"]["p50"]
            assert stats["wait_s"]["p50"] <= stats["wait_s"]["p95"] <= stats["wait_s"]["p99"]
            assert stats["workers_seen"] == 1
            hist = stats["run_hist"]
            assert hist["count"] == 5 and hist["counts"][-1] == 5 and hist["le"][-1] == "+Inf"
            assert hist["counts"][hist["le"].index(0.25)] == 4  # the 0.3 s one is above

            port = free_port()
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
            proc = subprocess.Popen(
                [sys.executable, "-m", "istos", "metrics", "a", "--port", str(port),
                 "--zenoh", cli_config(configs), "--prefix", prefix, "--timeout", "20",
                 "--budget", "20"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            try:
                assert proc.stdout is not None
                line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), WAIT_S)
                assert "/metrics" in line
                text = await asyncio.to_thread(_scrape, port)
            finally:
                proc.terminate()
                await asyncio.to_thread(proc.communicate, timeout=30)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    a = (("queue", "a"),)
    assert samples[("istos_wait_seconds_count", a)] == 5
    assert samples[("istos_run_seconds_bucket", (("le", "+Inf"), ("queue", "a")))] == 5
    assert samples[("istos_run_seconds_bucket", (("le", "0.25"), ("queue", "a")))] == 4
    assert samples[("istos_run_seconds_sum", a)] >= 0.3
    assert samples[("istos_workers", a)] == 1
    mine = (("queue", "a"), ("worker", "wk:work"))
    assert samples[("istos_worker_acked_total", mine)] == 4
    assert samples[("istos_worker_nacked_total", mine)] == 1


def _scrape(port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as resp:
        return resp.read().decode()


async def test_why_of_a_chain_step_and_a_chord_member_shows_the_workflow_over_zenoh():
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    for name in ("a", "b", "c", "m", "cb"):
        owner.queue(name, max_attempts=1)
    worker = Istos(zenoh=configs[1], prefix=prefix, node_id="wk")
    gate = asyncio.Event()

    @worker.worker("a")
    async def step_a(x: int) -> int:
        return x + 1

    @worker.worker("b")
    async def step_b(x: int) -> int:
        await gate.wait()  # the chain is held at its second step
        return x * 2

    @worker.worker("m", concurrency=2)
    async def member(x: int) -> int:
        if x == 1:
            raise RuntimeError("member failed")
        return x

    async with owner.serving(), worker.serving():
        first = await owner.workflows.chain(["a", "b", "c"], 1)
        chain_id = first.rpartition(".")[0]
        chord_id = await owner.workflows.chord("m", [0, 1], callback=("cb", None))
        await wait_until(lambda: owner.owners["b"].stats()["counts"]["leased"] == 1
                         and owner.owners["m"].stats()["counts"]["dead"] == 1, WAIT_S)

        out = await cli(configs, prefix, "why", "b", f"{chain_id}.1")
        assert out.returncode == 0, out.stderr
        text = out.stdout
        assert f"workflow: chain {chain_id}" in text
        lines = {line.split()[1]: line for line in text.splitlines() if "step " in line}
        assert "finished" in lines["0"] and f"{chain_id}.0" in lines["0"]
        assert "leased" in lines["1"] and "<- this job" in lines["1"]
        assert "not started" in lines["2"] and " c " in lines["2"]

        lq = await aattach("m", configs[2], prefix=prefix, timeout_s=20)
        try:
            why = await lq.awhy(f"{chord_id}.1")
            flow = why["workflow"]
            assert flow["kind"] == "chord" and flow["size"] == 2 and flow["index"] == 1
            jobs = flow["jobs"]
            assert list(jobs.job_id) == [f"{chord_id}.0", f"{chord_id}.1",
                                         f"{chord_id}.callback"]
            assert list(jobs.queue) == ["m", "m", "cb"]
            # members are forgotten once acked (no keep_results): "unknown" on their owner
            assert list(jobs.state) == ["unknown", "dead", "unknown"]
        finally:
            await lq.aclose()
        gate.set()
        await wait_until(lambda: owner.owners["c"].stats()["counts"]["ready"] == 1, WAIT_S)


async def test_every_queue_is_discovered_by_the_cli_metrics_and_the_notebook_over_zenoh():
    from prometheus_client.parser import text_string_to_metric_families

    from istos_nb import aqueues

    configs, prefix = isolated_configs(4), unique_prefix()
    one = Istos(zenoh=configs[0], prefix=prefix, node_id="one")
    one.queue("jobs/email")
    one.queue("b")
    two = Istos(zenoh=configs[1], prefix=prefix, node_id="two")
    two.queue("late")
    async with one.serving():
        for _ in range(3):
            await one.enqueue("jobs/email", {"x": 1})
        await one.enqueue("b", {"x": 1}, delay_s=600)
        out = await cli(configs, prefix, "queues")
        assert out.returncode == 0, out.stderr
        lines = out.stdout.splitlines()
        assert lines[0].split()[:4] == ["QUEUE", "OWNER", "ROLE", "READY"]
        assert [line.split()[:5] for line in lines[1:]] == [
            ["b", "one", "single", "0", "1"], ["jobs/email", "one", "single", "3", "0"]]
        stats = json.loads((await cli(configs, prefix, "stats", "--json")).stdout)
        assert sorted(stats) == ["b", "jobs/email"] and stats["b"]["counts"]["delayed"] == 1
        frame = await aqueues(configs[2], prefix=prefix, timeout_s=20)
        assert list(frame.queue) == ["b", "jobs/email"] and list(frame.owner) == ["one", "one"]
        assert list(frame.ready) == [0, 3] and bool(frame.up.all())

        port = free_port()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        proc = subprocess.Popen(
            [sys.executable, "-m", "istos", "metrics", "--port", str(port),
             "--zenoh", cli_config(configs), "--prefix", prefix, "--timeout", "20",
             "--budget", "20"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), WAIT_S)
            assert "every queue discovered" in line
            before = await asyncio.to_thread(_scrape, port)
            async with two.serving():
                await two.enqueue("late", {"x": 1})

                async def late_seen() -> bool:
                    scraped = await asyncio.to_thread(_scrape, port)
                    return 'istos_owner_up{queue="late"} 1.0' in scraped

                await wait_until(late_seen, WAIT_S, "the new queue in a scrape")
        finally:
            proc.terminate()
            await asyncio.to_thread(proc.communicate, timeout=30)
    ups = {s.labels["queue"]: s.value for f in text_string_to_metric_families(before)
           for s in f.samples if s.name == "istos_owner_up"}
    assert ups == {"b": 1.0, "jobs/email": 1.0}


def test_ages_instants_and_the_dashboard_link(monkeypatch):
    from istos.ops import operator_cmds as OC

    assert OC.parse_age("90") == 90 and OC.parse_age("15m") == 900
    assert OC.parse_age("1h") == 3600 and OC.parse_age("2d") == 172800
    with pytest.raises(ValueError, match="not an age"):
        OC.parse_age("soon")
    now = 1_800_000_000.0
    assert OC.parse_instant("1h", now) == now - 3600
    assert OC.parse_instant("1764547200", now) == 1764547200.0
    assert OC.parse_instant("2026-12-01T00:00:00+00:00", now) == 1796083200.0
    with pytest.raises(ValueError, match="not an instant"):
        OC.parse_instant("yesterday-ish", now)
    monkeypatch.delenv("ISTOS_DASHBOARD_URL", raising=False)
    assert OC.dashboard_link("jobs/email", "j1") == ""
    monkeypatch.setenv("ISTOS_DASHBOARD_URL", "http://127.0.0.1:8866/")
    assert OC.dashboard_link("jobs/email", "j1") == \
        "\n  open: http://127.0.0.1:8866/?queue=jobs%2Femail&job=j1"


def test_dashboard_views_of_workflows_results_tracebacks_histograms_and_queues():
    import pandas as pd

    from istos_nb.live.overview import queues_frame
    from istos_nb.views import opviews

    flow = {"kind": "chain", "id": "c", "step": 1, "jobs": pd.DataFrame(
        [{"index": 0, "queue": "a", "job_id": "c.0", "state": "finished"},
         {"index": 1, "queue": "b", "job_id": "c.1", "state": "leased"}],
        columns=["index", "queue", "job_id", "state"])}
    detail = {"why": {"state": "done", "result": {"echo": 1}, "result_size": 9,
                      "traceback": "Traceback ...\nValueError: <boom>", "workflow": flow}}
    html = opviews.detail_extras_html(detail)
    assert html.count('class="istos-step') == 2 and html.count("istos-step-here") == 1
    assert "c.0</code><br>finished" in html and " → " in html
    assert '&quot;echo&quot;: 1' in html and "ValueError: &lt;boom&gt;" in html  # escaped
    big = opviews.detail_extras_html({"why": {"state": "done", "result": None,
                                              "result_size": 70_000}})
    assert "70,000 bytes: too big to show" in big
    hist = {"le": [0.005, 0.01, "+Inf"], "counts": [2, 2, 5], "sum": 1.0, "count": 5}
    latency = opviews.latency_html({"wait_s": {"p50": 0.001, "p95": 0.002, "p99": 0.003,
                                               "n": 5}, "wait_hist": hist})
    assert "p99 0.003 s" in latency and "0–0.005 s" in latency and "&gt; 0.01 s" in latency
    assert "0.005–0.01 s" not in latency  # an empty bucket draws no bar
    frame = queues_frame([{"queue": "jobs/email", "owner": "one", "role": "single",
                           "replicas": [], "up": True, "counts": {"ready": 3, "dead": 1},
                           "enqueue_rate": 0.5, "ack_rate": 0.0, "paused": False},
                          {"queue": "gone", "role": "ha", "replicas": ["r1"], "up": False}])
    assert list(frame.ready.astype("object").where(frame.ready.notna(), None)) == [3, None]
    overview = opviews.overview_html(frame)
    assert 'href="?queue=jobs%2Femail"' in overview and "(no answer)" in overview


async def test_discovery_names_an_ha_queue_its_leader_and_replicas_over_zenoh():
    from istos.ops.discovery import queue_rows
    from istos.storage.memory import MemoryStorage

    configs, prefix = isolated_configs(3), unique_prefix()
    storage = MemoryStorage(durable=True, shared=True)
    apps = [Istos(zenoh=configs[i], prefix=prefix, node_id=name, storage=storage)
            for i, name in enumerate(("ra", "rb"))]
    for app in apps:
        app.queue("q", ha=True)
    async with apps[0].serving(), apps[1].serving():
        await wait_until(lambda: any(app.is_active_owner("q") for app in apps), WAIT_S)
        leader = next(app.node_id for app in apps if app.is_active_owner("q"))
        async with Operator(configs[2], prefix=prefix, timeout_s=20) as op:
            async def both_seen() -> bool:
                return len((await op.discover()).get("q", {}).get("replicas", [])) == 2

            await wait_until(both_seen, WAIT_S, "both replicas' tokens")
            (row,) = await queue_rows(op)
    assert row["queue"] == "q" and row["role"] == "ha" and row["up"] is True
    assert row["replicas"] == ["ra", "rb"] and row["owner"] == leader
