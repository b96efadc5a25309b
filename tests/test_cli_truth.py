"""The CLI's contracts as real subprocesses against live owners through a Zenoh router:
``--json`` prints a JSON object on every outcome, exit codes as the CLI reference
(docs/reference/cli.rst) says, unique id prefixes resolve, resubmit is idempotent, and queues
answer independently."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_cli import REPO, Mesh, cli, wait_for
from zenoh_util import unique_prefix

from istos import Istos, JobContext
from istos.client.follow import MARKERS


@pytest.fixture(name="mesh")
def _mesh() -> Iterator[Mesh]:
    m = Mesh()
    try:
        yield m
    finally:
        m.close()


@pytest.mark.timeout(180)
def test_cli_contracts_on_a_live_owner(mesh: Mesh) -> None:
    prefix = unique_prefix()
    owner = Istos(zenoh=mesh.clients[0], prefix=prefix, node_id="owner")
    owner.queue("q", max_attempts=1, admin=True)

    @owner.worker("q", concurrency=1, poll_interval_s=0.1)
    async def work(job: dict, ctx: JobContext) -> None:
        raise RuntimeError("poison")

    mesh.serve(owner)
    dead_id = mesh.run(owner.enqueue("q", {"n": 1}, job_id="feedc0de-dead"))
    mesh.run(owner.enqueue("q", {"n": 2}, job_id="abcdef01-x", delay_s=3600))
    mesh.run(owner.enqueue("q", {"n": 3}, job_id="abcdef02-y", delay_s=3600))
    wait_for(lambda: owner.owners["q"].stats()["counts"]["dead"] == 1, timeout_s=30)
    common = ["--zenoh", json.dumps(mesh.clients[2]), "--prefix", prefix]

    # A unique prefix of >= 6 characters resolves; an ambiguous one names the candidates.
    why = cli("why", "q", "feedc0", *common, "--json")
    assert why.returncode == 0, why.stderr
    assert json.loads(why.stdout)["job_id"] == dead_id
    assert json.loads(why.stdout)["state"] == "dead"
    ambiguous = cli("why", "q", "abcdef0", *common, "--json")
    assert ambiguous.returncode == 2
    assert json.loads(ambiguous.stdout)["error"] == "UsageError"
    assert "abcdef01-x" in ambiguous.stderr and "abcdef02-y" in ambiguous.stderr

    # Unknown job: exit 1 as the CLI reference says, and a JSON error object.
    unknown = cli("why", "q", "no-such-job", *common, "--json")
    assert unknown.returncode == 1
    assert json.loads(unknown.stdout)["error"] == "UnknownJob"
    assert unknown.stderr.startswith("istos: queue 'q' holds no job 'no-such-job'")
    assert cli("why", "q", "no-such-job", *common).stdout == ""

    # Resubmit twice (by prefix, then whole id, under the command's old name `requeue`, kept
    # one release): one new job, the same id both times.
    first = json.loads(cli("resubmit", "q", "feedc0", *common, "--json").stdout)
    second = cli("requeue", "q", dead_id, *common)
    assert first["status"] == "requeued" and first["dead_job_id"] == dead_id
    assert second.returncode == 0 and \
        second.stdout.strip() == f"{dead_id} was already resubmitted as {first['job_id']}"
    # (the resubmitted job is poison too: it dies again, but only one of it ever existed)
    assert owner.owners["q"].stats()["counts"]["ready"] \
        + owner.owners["q"].stats()["counts"]["leased"] \
        + owner.owners["q"].stats()["counts"]["dead"] == 2

    # Bad usage answers JSON too.
    bad = cli("jobs", "q", "--state", "bogus", *common, "--json")
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"] == "UsageError"
    assert "Traceback" not in bad.stderr


@pytest.mark.timeout(180)
def test_stats_of_several_queues_answers_for_those_that_answer(mesh: Mesh) -> None:
    prefix = unique_prefix()
    owner = Istos(zenoh=mesh.clients[0], prefix=prefix, node_id="owner")
    owner.queue("q1")
    mesh.serve(owner)
    mesh.run(owner.enqueue("q1", {}))
    common = ["--zenoh", json.dumps(mesh.clients[2]), "--prefix", prefix, "--timeout", "2"]

    text = cli("stats", "q1", "gone", *common)
    assert text.returncode == 0, text.stderr
    assert "queue q1 on owner" in text.stdout and "ready 1" in text.stdout
    assert "queue gone: NO ANSWER (no owner of queue 'gone'" in text.stdout
    assert text.stderr.startswith("istos: no owner of queue 'gone'")

    both = json.loads(cli("stats", "q1", "gone", "gone2", *common, "--json").stdout)
    assert both["q1"]["counts"]["ready"] == 1
    assert both["gone"]["error"] == "OwnerUnavailable" and "'gone'" in both["gone"]["message"]
    assert both["gone2"]["error"] == "OwnerUnavailable"

    none = cli("stats", "gone", "gone2", *common, "--json")
    assert none.returncode == 3 and json.loads(none.stdout)["error"] == "OwnerUnavailable"


@pytest.mark.timeout(360)
def test_series_of_a_draining_backlog_agree_with_stats_on_real_zenoh(mesh: Mesh) -> None:
    import asyncio

    import pandas as pd

    from istos_nb import attach

    prefix = unique_prefix()
    owner = Istos(zenoh=mesh.clients[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    worker = Istos(zenoh=mesh.clients[1], prefix=prefix, node_id="wk")
    gate = asyncio.Event()

    @worker.worker("q", concurrency=8, poll_interval_s=0.05)
    async def work(job: dict, ctx: JobContext) -> None:
        await gate.wait()  # opened once the backlog is in: then it drains
        await asyncio.sleep(0.005)

    mesh.serve(owner)
    mesh.run(owner.enqueue_many("q", [{"i": i} for i in range(2000)]), timeout_s=60)
    mesh.serve(worker)
    lq = attach("q", mesh.clients[2], prefix=prefix, timeout_s=10)
    try:
        mesh.run(_open(gate))
        wait_for(lambda: owner.owners["q"].stats()["counts"]["ready"] < 1900, timeout_s=60)
        before = lq.stats()["counts"]["ready"]
        df = lq.series()
        after = lq.stats()["counts"]["ready"]
        # The owner's truth as of the request: between the counts just before and just after
        # (the backlog only shrinks), so within the bucket being filled.
        assert after <= int(df["ready"].iloc[-1]) <= before < 1900
        assert isinstance(df.index, pd.DatetimeIndex) and str(df.index.tz) == "UTC"
        assert abs(pd.Timestamp.now(tz="UTC") - df.index[-1]) < pd.Timedelta(seconds=30)
        assert int(df["enqueued"].sum()) == 2000
        wait_for(lambda: owner.owners["q"].stats()["counts"]["ready"] == 0
                 and owner.owners["q"].stats()["counts"]["leased"] == 0, timeout_s=180)
        done = lq.series()
        assert int(done["ready"].iloc[-1]) == 0 and int(done["acked"].sum()) == 2000
        assert done["wait_p99"].dropna().max() > done["wait_p50"].dropna().min()
        minutes = lq.series(resolution="1min")
        assert int(minutes["acked"].sum()) == 2000
        assert list(minutes.columns) == list(done.columns)

        out = cli("series", "q", "--json", "--since", "600", "--zenoh",
                  json.dumps(mesh.clients[3]), "--prefix", prefix)
        assert out.returncode == 0, out.stderr
        rows = json.loads(out.stdout)["rows"]
        assert rows[-1]["ready"] == 0 and sum(r["acked"] for r in rows) == 2000
        table = cli("series", "q", "--limit", "5", "--zenoh", json.dumps(mesh.clients[3]),
                    "--prefix", prefix)
        shown, total = map(int, re.match(r"last (\d+) of (\d+) buckets\n",
                                         table.stdout).groups())  # type: ignore[union-attr]
        assert shown == min(5, total) and "WAIT P95" in table.stdout
    finally:
        lq.close()


async def _open(gate: Any) -> None:
    gate.set()


def test_a_simulation_gives_the_same_series_frame():
    import asyncio

    from istos_nb.data.series import SERIES_COLUMNS
    from istos_nb.sim import Simulation

    sim = Simulation(seed=3)
    node = sim.node("owner")
    node.queue("q")

    @node.worker("q", concurrency=2)
    async def work(job: dict, ctx: JobContext) -> None:
        await asyncio.sleep(0.5)

    for i in range(20):
        sim.at(float(i) / 10, node.enqueue, "q", {"i": i})
    result = sim.run(until=120.0)
    df = result.series("q")
    assert list(df.columns) == list(SERIES_COLUMNS) and df.index.name == "t"
    assert int(df["enqueued"].sum()) == 20 and int(df["acked"].sum()) == 20
    assert int(df["ready"].max()) > 0 and int(df["ready"].iloc[-1]) == 0
    assert df["run_p50"].dropna().between(pd_seconds(0.45), pd_seconds(0.55)).all()
    assert int(result.series("q", "1min")["acked"].sum()) == 20
    # One chart function draws it (and a live owner's series alike), on a wall-clock axis.
    from matplotlib.dates import date2num

    from istos_nb.views.series_charts import series_depth_chart, series_throughput_chart

    fig = series_depth_chart(df)
    ready = next(line for line in fig.axes[0].lines if line.get_gid() == "series_ready")
    assert list(ready.get_ydata()) == list(df["ready"])
    assert ready.get_xdata()[-1] == df.index[-1].tz_localize(None) or \
        date2num(ready.get_xdata()[-1]) == date2num(df.index[-1].tz_localize(None))
    gids = {line.get_gid() for line in series_throughput_chart(df).axes[0].lines}
    assert {"series_rate_acked", "series_rate_enqueued"} <= gids


def pd_seconds(s: float) -> Any:
    import pandas as pd

    return pd.Timedelta(seconds=s)


class Lines:
    """A subprocess's stdout lines with the monotonic time each arrived (a reader thread)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.lines = proc, []  # type: list[tuple[float, str]]
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._changed:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self._changed.notify_all()

    def wait(self, pred: Callable[[str], bool], timeout_s: float = 60.0) -> tuple[float, str]:
        """The first line (arrival time, text) satisfying ``pred``; AssertionError after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for t, line in self.lines:
                    if pred(line):
                        return t, line
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no such line in time; got {self.lines[-20:]}")
                self._changed.wait(left)


def _owner_proc(config: dict[str, Any], prefix: str) -> tuple[subprocess.Popen[str], Lines]:
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "procs" / "follow_owner.py"),
                             json.dumps(config), prefix], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=_env())
    lines = Lines(proc)
    lines.wait(lambda s: s == "READY")
    return proc, lines


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def _kind(line: str) -> str | None:
    try:
        return json.loads(line).get("kind")
    except ValueError:
        return None


@pytest.mark.timeout(240)
def test_follow_says_when_the_owner_dies_and_what_it_missed(mesh: Mesh) -> None:
    prefix, timeout_s = unique_prefix(), 3.0
    owner, owner_out = _owner_proc(mesh.clients[0], prefix)
    follower = subprocess.Popen(
        [sys.executable, "-m", "istos", "follow", "q", "--json", "--timeout", str(timeout_s),
         "--zenoh", json.dumps(mesh.clients[2]), "--prefix", prefix],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    restarted = None
    try:
        out = Lines(follower)
        wait_for(lambda: owner.poll() is None and bool(follower.poll() is None), 5)
        # The follower subscribes, then asks the owner to publish: wait until events flow.
        for _ in range(60):
            assert owner.stdin is not None
            owner.stdin.write("enqueue 1\n")
            owner.stdin.flush()
            try:
                out.wait(lambda s: _kind(s) == "enqueued", timeout_s=1.0)
                break
            except AssertionError:
                continue
        owner.kill()  # SIGKILL: no goodbye
        killed = time.monotonic()
        owner.wait(30)
        lost_at, lost = out.wait(lambda s: _kind(s) == "owner_lost", timeout_s=60)
        assert lost_at - killed < 2 * timeout_s, (lost_at - killed, lost)
        assert "'q'" in json.loads(lost)["message"]

        restarted, _ = _owner_proc(mesh.clients[1], prefix)
        assert restarted.stdin is not None
        restarted.stdin.write("enqueue 3\n")
        restarted.stdin.flush()
        back_at, _ = out.wait(lambda s: _kind(s) == "owner_back")
        gap_at, gap_line = out.wait(lambda s: _kind(s) == "gap")
        gap = json.loads(gap_line)
        assert gap["lost_with_owner"] is True and gap["missed"] == 0
        new_epoch = gap["epoch"]
        wait_for(lambda: sum(1 for _, s in out.lines if _kind(s) == "enqueued"
                             and json.loads(s)["seq"][0] == new_epoch) == 3, timeout_s=60)
        texts = [s for _, s in out.lines]
        first_new = min(i for i, s in enumerate(texts) if _kind(s) == "enqueued"
                        and json.loads(s)["seq"][0] == new_epoch)
        assert texts.index(gap_line) < first_new  # the gap is said before the new events
        # Every event of the new owner, from its first, once each and in order (those it
        # emitted before the follower reconnected came through its ring).
        seqs = [json.loads(s)["seq"][1] for s in texts if _kind(s) not in MARKERS
                and json.loads(s).get("seq", [None])[0] == new_epoch]
        assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 3
    finally:
        for proc in (owner, restarted, follower):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(30)


@pytest.mark.timeout(180)
def test_live_queue_follow_says_owner_lost_back_and_restarted(mesh: Mesh) -> None:
    from istos_nb import attach

    prefix = unique_prefix()
    first = Istos(zenoh=mesh.clients[0], prefix=prefix, node_id="owner")
    first.queue("q")
    mesh.serve(first)
    lq = attach("q", mesh.clients[2], prefix=prefix, timeout_s=1.0)
    try:
        lq.follow()
        wait_for(lambda: bool(mesh.run(first.enqueue("q", {}))) and
                 lq.stream_stats["last_seq"] > 0, timeout_s=60)
        epoch = lq.stream_stats["epoch"]
        assert lq.stream_stats["owner_up"] is True and epoch
        mesh.run(first.stop())
        mesh.apps.remove(first)
        wait_for(lambda: lq.stream_stats["owner_up"] is False, timeout_s=30)
        assert lq.stream_stats["owner_lost"] == 1
        second = Istos(zenoh=mesh.clients[1], prefix=prefix, node_id="owner2")
        second.queue("q")
        mesh.serve(second)
        wait_for(lambda: lq.stream_stats["owner_up"] is True, timeout_s=30)
        wait_for(lambda: bool(mesh.run(second.enqueue("q", {}))) and
                 lq.stream_stats["owner_restarts"] == 1, timeout_s=60)
        stats = lq.stream_stats
        assert stats["epoch"] != epoch and stats["owner_back"] == 1
    finally:
        lq.close()
