"""Traces and replay (issue 27) in the virtual world, the trace file, and ``istos record``.

The faithfulness test on real Zenoh and real processes is tests/test_replay_live.py.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from test_cli import Mesh, _following, cli

from istos import Istos, tracefile
from istos_nb.data.trace import Trace, TraceFormatError
from istos_nb.sim import ScenarioError, Simulation
from istos_nb.sim.replay import replay
from istos_nb.views.compare import PREDICTED, compare, compare_chart, predict, run_metrics

pytestmark = pytest.mark.fast  # `make check`: no process, server or session

REPO = Path(__file__).resolve().parents[1]
POLICY = {"lease_s": 5.0, "max_attempts": 3, "retry_backoff_s": 0.2, "retry_jitter": 0.0}


def recorded_run(seed: int = 1, crash_at: float | None = 8.0):
    """A simulated 'production' run: Poisson arrivals, lognormal runs, 10% nacks, a crash."""
    sim = Simulation(seed=seed)
    sim.node("owner").queue("q", **POLICY)
    for name in ("w0", "w1"):
        sim.node(name).worker("q", concurrency=2, prefetch=0)(
            sim.handler(service_s=("lognormal", -1.2, 0.6), fail_p=0.1))
    sim.enqueue_jobs("owner", "q", 150, rate=8, poisson=True, start=1.0)
    if crash_at is not None:
        sim.crash("w1", at=crash_at)
    return sim.run(80, progress=None)


@pytest.fixture(scope="module")
def run():
    return recorded_run()


@pytest.fixture(scope="module")
def trace(run):
    return Trace.from_events(run.job_events(), policy=POLICY)


# -- the trace ------------------------------------------------------------------------------------
def test_a_trace_holds_jobs_attempts_fleet_and_crashes(run, trace):
    assert trace.queue == "q" and trace.policy == POLICY
    assert len(trace.jobs) == 150 and trace.jobs["arrival"].iloc[0] == 0.0
    assert trace.jobs["arrival"].is_monotonic_increasing
    att = trace.attempts
    assert set(att["outcome"]) <= {"acked", "nacked", "expired"}
    assert (att["outcome"] == "acked").sum() == 150
    assert att.loc[att["outcome"] == "acked", "run_s"].gt(0).all()
    assert att.loc[att["outcome"] == "expired", "run_s"].isna().all()
    assert trace.fleet.to_dict("records") == [{"node": "w0", "slots": 2, "concurrency": 2},
                                              {"node": "w1", "slots": 2, "concurrency": 2}]
    # from the simulator's crashed event: 8.0 virtual s, arrivals from 1.0
    assert trace.crashes == [{"node": "w1", "t": 7.0, "restart_after": None}]
    expired = att[att["outcome"] == "expired"]
    assert len(expired) >= 1 and expired["crashed"].all() and set(expired["node"]) == {"w1"}


def test_a_crash_is_inferred_when_the_stream_does_not_mark_it(run, trace):
    live_like = [e for e in run.job_events() if e["kind"] != "crashed"]
    inferred = Trace.from_events(live_like, policy=POLICY)
    (crash,) = inferred.crashes
    # dated by the node's last act: at most one run before the real crash, or a little after
    # (a claim the dead node had parked at the owner may still be granted)
    assert crash["node"] == "w1" and 6.0 < crash["t"] <= 7.5
    assert inferred.attempts["crashed"].sum() == trace.attempts["crashed"].sum()


def hand_built(*, slot1_back: float | None, slot0: list[tuple[float, float]]) -> list[dict]:
    """Node w (slots #0 and #1) and node v, lease 4 s: j2 is claimed by w:f#1 at 100.2 and its
    lease runs out at 104.2 (v runs its retry); w acts on slot #0 at ``slot0`` (claim, ack)
    and w:f#1 claims j9 at ``slot1_back``. No crashed/restarted marks: a live stream."""
    out: list[dict] = []

    def add(t, kind, job, attempt=0, worker=None, **detail):
        out.append({"t": t, "node": "owner", "queue": "q", "job_id": job, "kind": kind,
                    "attempt": attempt, "worker": worker, "detail": detail})

    def run(job, worker, claimed, acked, attempt=1):
        add(claimed, "claimed", job, attempt, worker, lease_s=4.0, deadline=claimed + 4.0)
        add(acked, "acked", job, attempt, worker)

    add(100.0, "enqueued", "j1")
    run("j1", "w:f#0", 100.0, 100.5)
    add(100.2, "enqueued", "j2")
    add(100.2, "claimed", "j2", 1, "w:f#1", lease_s=4.0, deadline=104.2)
    add(104.2, "lease_expired", "j2", 1, "w:f#1")
    add(104.2, "retry_scheduled", "j2", 1, None, delay_s=0.0)
    run("j2", "v:f#0", 104.3, 104.6, attempt=2)
    add(100.6, "enqueued", "j3")
    run("j3", "w:f#0", 100.6, 100.9)
    for i, (claimed, acked) in enumerate(slot0):
        add(claimed - 0.01, "enqueued", f"k{i}")
        run(f"k{i}", "w:f#0", claimed, acked)
    if slot1_back is not None:
        add(slot1_back - 0.01, "enqueued", "j9")
        run("j9", "w:f#1", slot1_back, slot1_back + 0.3)
    return sorted(out, key=lambda e: e["t"])


@pytest.mark.parametrize("slot1_back, slot0, crashes", [
    # killed after its ack at 100.9, back under its own name at 102.0: its slot #1 claims while
    # j2's lease still runs, which no live slot does (it is busy until its job ends)
    (102.0, [(103.0, 103.4)], [{"node": "w", "t": 0.9, "restart_after": 1.1}]),
    # back only at 106.0, after j2's lease ran out: 5.1 s of silence, longer than any run
    (106.0, [(106.5, 106.9)], [{"node": "w", "t": 0.9, "restart_after": 5.1}]),
    # never back: the old rule
    (None, [], [{"node": "w", "t": 0.9, "restart_after": None}]),
    # alive, j2 only ran past its lease: slot #0 kept working, slot #1 free again at 104.5
    (104.5, [(101.5, 101.8), (103.0, 103.4)], []),
])
def test_a_worker_restarted_under_its_own_name_is_a_crash_and_a_return(slot1_back, slot0,
                                                                       crashes):
    trace = Trace.from_events(hand_built(slot1_back=slot1_back, slot0=slot0),
                              policy={"lease_s": 4.0})
    got = [{**c, "t": round(c["t"], 6), "restart_after": None if c["restart_after"] is None
            else round(c["restart_after"], 6)} for c in trace.crashes]
    assert got == crashes
    att = trace.attempts.set_index(["job_id", "attempt"])
    assert bool(att.loc[("j2", 1), "crashed"]) == bool(crashes)
    assert set(trace.fleet["node"]) == {"v", "w"}  # one node w, before and after its restart
    assert int(trace.fleet.set_index("node").loc["w", "slots"]) == 2


def test_a_restart_is_inferred_from_a_live_stream_and_replayed_at_its_moment():
    """A simulated run whose w1 dies at 8.0 and is back at 9.0, its crash marks removed: the
    trace finds the crash and the return, and replay kills w1 at that moment (its deliveries
    then are lost, it claims nothing while down) and brings it back when the recording did."""
    sim = Simulation(seed=1)
    sim.node("owner").queue("q", **POLICY)
    for name in ("w0", "w1"):
        sim.node(name).worker("q", concurrency=2, prefetch=0)(
            sim.handler(service_s=("lognormal", -1.2, 0.6), fail_p=0.1))
    sim.enqueue_jobs("owner", "q", 150, rate=8, poisson=True, start=1.0)
    sim.crash("w1", at=8.0, restart_after=1.0)
    events = sim.run(80, progress=None).job_events()
    marked = Trace.from_events(events, policy=POLICY)
    live = Trace.from_events([e for e in events if e["kind"] not in ("crashed", "restarted")],
                             policy=POLICY)
    assert marked.crashes == [{"node": "w1", "t": 7.0, "restart_after": 1.0}]
    (crash,) = live.crashes
    # its last act reaching the owner: before the kill, or an ack on the wire when it came
    assert crash["node"] == "w1" and 6.5 < crash["t"] < 7.1
    back = crash["t"] + crash["restart_after"]
    assert 8.0 <= back < 8.5  # its first claim after the restart
    assert live.attempts["crashed"].sum() == marked.attempts["crashed"].sum() >= 1
    result = replay(live, seed=1)
    replayed = Trace.from_events(result.job_events())
    claims = replayed.attempts[replayed.attempts["node"] == "w1"]["claimed"]
    assert not claims.between(crash["t"] + 0.01, back - 0.01).any()  # down in between
    assert (claims > back).any()  # and back after
    (again,) = replayed.crashes
    assert again["t"] + again["restart_after"] == pytest.approx(back, abs=1e-6)
    recorded, same = run_metrics(live), run_metrics(result)
    assert same["attempts_hist"] == recorded["attempts_hist"]
    assert same["redeliveries"] == recorded["redeliveries"]
    assert same["wait_p95"] == pytest.approx(recorded["wait_p95"], rel=0.15)


def test_from_events_picks_a_queue_and_reads_the_lease_from_claims(run):
    events = run.job_events()
    other = [{**e, "queue": "other"} for e in events if e["job_id"]]
    with pytest.raises(ValueError, match="several queues"):
        Trace.from_events(events + other)
    picked = Trace.from_events(events + other, queue="q")
    assert len(picked.jobs) == 150 and picked.policy == {"lease_s": 5.0}


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_save_and_load_round_trip(trace, tmp_path, name):
    trace.bodies = {"x": {"body_of": "x", "size": 12, "data": {"a": 1}}}
    path = tmp_path / name
    trace.save(path)
    if name.endswith(".gz"):
        with gzip.open(path, "rt") as f:
            head = json.loads(f.readline())
    else:
        head = json.loads(path.read_text().splitlines()[0])
    assert head["format"] == "istos-trace" and head["version"] == tracefile.TRACE_VERSION
    back = Trace.load(path)
    assert back.events == trace.events and back.policy == trace.policy
    assert back.bodies == trace.bodies and back.jobs.equals(trace.jobs)
    trace.bodies = {}


@pytest.mark.parametrize("lines, match", [
    (['{"hello": 1}'], "not an Istos trace"),
    (["not json"], "not JSON"),
    (['{"format": "istos-trace", "version": 99, "queue": "q", "policy": {}}'], "newer"),
    (['{"format": "istos-trace", "version": 1, "queue": 3, "policy": {}}'], "queue"),
    (['{"format": "istos-trace", "version": 1, "queue": "q", "policy": {}}',
      '{"t": "soon", "kind": "claimed", "job_id": "a"}'], ":2: event time"),
    (['{"format": "istos-trace", "version": 1, "queue": "q", "policy": {}}',
      '{"t": 1.0, "kind": "claimed", "job_id": "a", "attempt": -1}'], "attempt"),
    (['{"format": "istos-trace", "version": 1, "queue": "q", "policy": {}}',
      '{"t": 1.0, "kind": "claimed", "job_id": "a", "detail": [1]}'], "detail"),
    (['{"format": "istos-trace", "version": 1, "queue": "q", "policy": {}}',
      '{"body_of": "a", "size": -3}'], "size"),
    (['{"format": "istos-trace", "version": 1, "queue": "q", "policy": {}}',
      '{"t": 1.0, "kind": "claimed", "job_id": "' + "x" * tracefile.MAX_LINE + '"}'],
     "longer than"),
])
def test_a_bad_trace_file_is_refused_naming_the_line(tmp_path, lines, match):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError, match=match):
        Trace.load(path)


# -- replay ---------------------------------------------------------------------------------------
def test_replay_under_the_recorded_policy_measures_what_was_recorded(trace):
    recorded = run_metrics(trace)
    replays = [run_metrics(replay(trace, seed=s)) for s in range(3)]
    replayed = replays[0]
    for key in ("wait_p50", "wait_p95"):  # a replay's own seed moves a median by up to ~15%
        mean = sum(r[key] for r in replays) / len(replays)
        assert mean == pytest.approx(recorded[key], rel=0.15), (recorded, replays)
    assert replayed["done"] == recorded["done"] == 150
    assert replayed["attempts_hist"] == recorded["attempts_hist"]
    assert abs(replayed["redeliveries"] - recorded["redeliveries"]) <= 1


def test_replay_is_deterministic_per_seed(trace):
    a, b = replay(trace, seed=3), replay(trace, seed=3)
    assert a.events_raw == b.events_raw


def test_what_ifs_move_the_figures_the_right_way(trace):
    base = run_metrics(replay(trace))
    more = run_metrics(replay(trace, workers=4))
    assert more["wait_p95"] < base["wait_p95"]
    short = run_metrics(replay(trace, lease_s=0.2, retry_backoff_s=0.0))
    assert short["duplicated_runs"] > base["duplicated_runs"] == 0
    assert short["redeliveries"] > base["redeliveries"]
    beat = run_metrics(replay(trace, lease_s=0.2, heartbeat=True))
    assert beat["duplicated_runs"] == 0  # renewals keep a live worker's long runs its own


@pytest.mark.parametrize("kwargs, match", [
    ({"lease": 3}, "unknown option"), ({"workers": 0}, "workers"),
    ({"concurrency": 1.5}, "concurrency"),
])
def test_replay_refuses_bad_options(trace, kwargs, match):
    with pytest.raises(ScenarioError, match=match):
        replay(trace, **kwargs)


def test_replay_of_an_empty_trace_says_so():
    with pytest.raises(ScenarioError, match="no enqueued job"):
        replay(Trace.from_events([], queue="q"))


def test_compare_table_and_chart(trace):
    a, b = replay(trace), replay(trace, workers=3)
    table = compare(trace, a, b)
    assert list(table.columns) == ["recorded", "replay", "replay 2"]
    assert {"wait_p50", "wait_p95", "wait_p99", "run_p50", "done", "dead", "duplicated_runs",
            "redeliveries", "attempts_hist", "peak_depth"} <= set(table.index)
    assert table.loc["done", "replay"] == 150
    fig = compare_chart(trace, a, b, names=["live", "same", "3 workers"])
    assert isinstance(fig, Figure)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == \
        ["live", "same", "3 workers"]
    with pytest.raises(ValueError, match="labels"):
        compare(trace, a, names=["one"])


def test_predict_is_the_mean_of_replays_over_seeds_and_says_their_spread(trace):
    table = predict(trace, seeds=2, lease_s=0.2)
    dups = [run_metrics(replay(trace, seed=s, lease_s=0.2))["duplicated_runs"] for s in (0, 1)]
    row = table.loc["duplicated_runs"]
    assert [row["seed 0"], row["seed 1"]] == dups
    assert row["mean"] == pytest.approx(sum(dups) / 2)
    assert row["sd"] == pytest.approx(abs(dups[0] - dups[1]) / 2)
    assert (row["min"], row["max"]) == (min(dups), max(dups))
    assert set(PREDICTED) == set(table.index) and list(table.columns) == \
        ["mean", "sd", "min", "max", "seed 0", "seed 1"]
    assert list(predict(trace, seeds=[7]).columns) == ["mean", "sd", "min", "max", "seed 7"]
    for bad in (0, [], True, "3", [1.5]):
        with pytest.raises(ScenarioError, match="seeds"):
            predict(trace, seeds=bad)


def test_the_overlay_charts_draw_both_runs_on_one_axis(trace):
    from istos_nb import charts

    result = replay(trace, seed=1)
    gantt = charts.replay_gantt(trace, result).axes[0]
    colls = {c.get_gid(): c for c in gantt.collections}
    assert len(colls["recorded_leases"].get_paths()) == len(trace.attempts)
    assert len(colls["leases"].get_paths()) == len(Trace.from_events(result.job_events()).attempts)
    assert [t.get_text() for t in gantt.get_yticklabels()] == ["w0 #0", "w0 #1", "w1 #0", "w1 #1"]
    assert "crash" in colls  # the recorded crash of w1, on its lanes
    # the first recorded and replayed leases start at the same x (seconds from the arrival)
    first = [c.get_paths()[0].vertices[0, 0] for c in (colls["recorded_leases"], colls["leases"])]
    assert first[0] == pytest.approx(first[1], abs=0.05)
    by_job = charts.replay_gantt(trace, result, by="job", max_jobs=10).axes[0]
    assert len(by_job.get_yticklabels()) == 10
    assert "10 of 150 jobs shown" in by_job.get_legend().get_title().get_text()
    with pytest.raises(ValueError, match="by"):
        charts.replay_gantt(trace, result, by="node")
    zoom = charts.replay_gantt(trace, result, window=(6.0, 9.0)).axes[0]
    assert zoom.get_xlim() == (6.0, 9.0)
    shown = [c for c in zoom.collections if c.get_gid() == "recorded_leases"][0]
    assert 0 < len(shown.get_paths()) < len(trace.attempts)  # only what overlaps the window
    with pytest.raises(ValueError, match="window"):
        charts.replay_gantt(trace, result, window=(9.0, 6.0))
    depth = charts.replay_depth(trace, result).axes[0]
    assert {line.get_gid() for line in depth.lines} == {
        "depth_ready", "depth_leased", "depth_ready_replayed", "depth_leased_replayed"}
    assert [t.get_text() for t in depth.get_legend().get_texts()] == [
        "ready", "leased", "ready, replayed", "leased, replayed"]


# -- istos record ---------------------------------------------------------------------------------
@pytest.mark.fast(False)  # starts a process
def test_the_trace_writer_does_not_import_the_notebook_side():
    code = ("import sys, istos.ops.record, istos.tracefile\n"
            "bad = [m for m in sys.modules if m.startswith(('istos_nb', 'pandas'))]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30,
                   env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.slow
@pytest.mark.fast(False)  # starts a process
@pytest.mark.timeout(120)
def test_istos_record_writes_a_trace_replay_reads(tmp_path):
    mesh = Mesh()
    try:
        from zenoh_util import unique_prefix

        prefix = unique_prefix()
        owner = Istos(zenoh=mesh.clients[0], prefix=prefix, node_id="owner")
        owner.queue("q", lease_s=5)
        worker = Istos(zenoh=mesh.clients[1], prefix=prefix, node_id="wk")
        done = threading.Event()

        @worker.worker("q", poll_interval_s=0.2)
        async def work(job):
            if job.get("last"):
                done.set()

        mesh.serve(owner)
        mesh.serve(worker)
        out = tmp_path / "rec.jsonl.gz"
        common = ["--zenoh", json.dumps(mesh.clients[2]), "--prefix", prefix]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen([sys.executable, "-m", "istos", "record", "q", "--seconds", "8",
                                 "-o", str(out), "--bodies", *common],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
        try:
            deadline = threading.Event()
            for _ in range(1500):
                if _following(owner.owners["q"]):
                    break
                deadline.wait(0.02)
            ids = [mesh.run(owner.enqueue("q", {"i": i})) for i in range(4)]
            ids.append(mesh.run(owner.enqueue("q", {"i": 4, "last": True}, delay_s=2.5)))
            assert done.wait(30)
            stdout, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        assert proc.returncode == 0, stderr
        assert "5 jobs enqueued" in stdout and str(out) in stdout
        trace = Trace.load(out)
        assert set(trace.jobs["job_id"]) == set(ids) and trace.policy["lease_s"] == 5.0
        assert (trace.attempts["outcome"] == "acked").sum() == 5
        assert trace.bodies[ids[4]]["data"] == {"i": 4, "last": True}  # it waited: polled
        assert trace.jobs.set_index("job_id").loc[ids[4], "delay_s"] == pytest.approx(2.5)
        assert run_metrics(replay(trace))["done"] == 5
    finally:
        mesh.close()


@pytest.mark.fast(False)  # starts a process
def test_istos_record_bad_usage(tmp_path):
    assert cli("record", "q", "-o", str(tmp_path / "x")).returncode == 2  # no --seconds
    bad = cli("record", "q", "--seconds", "0", "-o", str(tmp_path / "x"), "--timeout", "0.5")
    assert bad.returncode == 2 and "seconds" in bad.stderr and "Traceback" not in bad.stderr


def test_record_seconds_are_checked():
    from istos.errors import ConfigError
    from istos_nb.live.record import check_seconds

    for bad in (0, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ConfigError, match="seconds"):
            check_seconds(bad)


# -- found by replay: a worker stopping with a claim in flight -------------------------------------
def test_a_worker_stopped_with_a_claim_in_flight_hands_its_jobs_back():
    """Cancelled mid-claim, the reply (and the lease the owner granted) was lost and the job
    burnt an attempt on its expiry; now the claim lands and the job is released uncounted."""
    sim = Simulation(seed=0, latency_s=(0.1, 0.1))
    sim.node("owner").queue("q", lease_s=5, max_attempts=1)
    w = sim.node("w")

    @w.worker("q", poll_interval_s=30)
    async def work(job):
        await asyncio.sleep(10)

    sim.at(2.0, sim.nodes["owner"].enqueue, "q", {}, job_id="j")
    sim.at(2.15, w.stop)  # the nudge reached w at 2.1; its claim is on the wire until 2.3
    result = sim.run(20, progress=None)
    kinds = [(e["kind"], e["detail"].get("spared")) for e in result.events_raw
             if e["job_id"] == "j"]
    assert ("claimed", None) in kinds
    assert ("retry_scheduled", True) in kinds  # handed back: ready again, attempt not counted
    assert ("lease_expired", None) not in kinds and ("dead_lettered", None) not in kinds


# -- the LiveDashboard's replay tab ----------------------------------------------------------------
class RingQueue:
    """What the replay tab asks of a LiveQueue: stats' policy and the event ring."""

    queue = "q"

    def __init__(self, events):
        self._events = events

    def stats(self):
        return {"policy": POLICY}

    def raw_events(self, limit):
        return self._events[-limit:]


def test_the_dashboard_replay_tab_runs_a_what_if_on_the_last_minutes(run):
    from istos_nb.views.replay_panel import ReplayPanel

    panel = ReplayPanel(RingQueue(run.job_events()))
    panel.minutes.value, panel.workers.value, panel.lease.value = 60, 4, 2.0
    assert panel.what_if() == {"lease_s": 2.0, "workers": 4}
    panel.run()
    assert "150 jobs" in panel.status.value and "error" not in panel.status.value
    assert "what-if" in panel.table.value and "wait_p95" in panel.table.value
    assert panel.chart.value[:4] == b"\x89PNG" and panel.chart.layout.display == ""
    assert panel.gantt.value[:4] == b"\x89PNG" and panel.gantt.layout.display == ""
    short = ReplayPanel(RingQueue(run.job_events()))
    short.minutes.value = 0.1  # the last 6 s of the ring: after the last arrival
    short.run()
    assert "no enqueued job" in short.status.value  # (it says so, it does not guess)
    empty = ReplayPanel(RingQueue([]))
    empty.run()
    assert "error" in empty.status.value and "no enqueued job" in empty.status.value
