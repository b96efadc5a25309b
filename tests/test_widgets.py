"""The notebook dashboards, driven from Python the way a notebook user drives them.

``SimDashboard`` is exercised through its controls and its Run button; ``LiveDashboard`` through
``RecordedQueue`` — a test fixture standing in for the network client
``istos_nb.live.attach.LiveQueue``, replaying a recorded simulation's events — and once against a
real owner over Zenoh on loopback.
"""

from __future__ import annotations

import asyncio
import io
import re
import threading
import time
from collections.abc import Callable
from html.parser import HTMLParser
from typing import Any

import matplotlib.image
import pandas as pd
import pytest

from istos_nb.data.frames import events_frame, jobs_frame, leases_frame
from istos_nb.sim.result import SimResult
from istos_nb.views import widgets
from istos_nb.views.widgets import (
    DEFAULT_PARAMS,
    LiveDashboard,
    SimDashboard,
    scenario_from_params,
    table_html,
)

SMALL = {"jobs": 40, "rate": 4.0, "workers": 2, "concurrency": 2, "fail_p": 0.3}


# -- helpers ----------------------------------------------------------------------------------


class _Rows(HTMLParser):
    """Collects the cell texts of every <tbody> row of an HTML fragment."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._in_body = self._in_cell = False

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        if tag == "tbody":
            self._in_body = True
        elif tag == "tr" and self._in_body:
            self.rows.append([])
        elif tag == "td" and self._in_body:
            self._in_cell = True
            self.rows[-1].append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "tbody":
            self._in_body = False
        elif tag == "td":
            self._in_cell = False

    def handle_data(self, data: str) -> None:
        if self._in_cell:
            self.rows[-1][-1] += data


def table_rows(fragment: str) -> list[list[str]]:
    parser = _Rows()
    parser.feed(fragment)
    return parser.rows


def png_shape(data: bytes) -> tuple[int, ...]:
    """Decode the PNG (proving it is one) and return its array shape."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return matplotlib.image.imread(io.BytesIO(data), format="png").shape


def wait_for(pred: Callable[[], bool], timeout_s: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.01)


class RecordedQueue:
    """TEST FIXTURE standing in for ``istos_nb.live.attach.LiveQueue`` (the network client).

    Serves the first ``upto`` events of a recorded simulation as if a live owner had emitted
    them so far; ``advance(n)`` lets more "happen". Counts calls, and can be told to fail
    (as an unreachable owner does) to test the dashboard's error path.
    """

    def __init__(self, result: SimResult, upto: int | None = None) -> None:
        self._all = result.job_events()
        self.upto = len(self._all) if upto is None else upto
        self.calls: dict[str, int] = {}
        self.fail_with: Exception | None = None
        self._lock = threading.Lock()  # the dashboard's timer thread calls in too

    def _seen(self, method: str) -> list[dict[str, Any]]:
        with self._lock:
            self.calls[method] = self.calls.get(method, 0) + 1
        if self.fail_with is not None:
            raise self.fail_with
        return self._all[:self.upto]

    def advance(self, n: int) -> None:
        self.upto = min(len(self._all), self.upto + n)

    def stats(self) -> dict[str, Any]:
        jobs = jobs_frame(self._seen("stats"))
        return {"queue": "jobs", "node": "owner", "paused": False, "enqueue_rate": 2.0,
                "ack_rate": 1.5, "counts": jobs["state"].value_counts().to_dict()}

    def jobs(self, state: str | list[str] | None = None, limit: int = 100,
             offset: int = 0) -> pd.DataFrame:
        jobs = jobs_frame(self._seen("jobs"))
        states = [state] if isinstance(state, str) else state
        if states is not None:
            jobs = jobs[jobs["state"].isin(states)]
        page = jobs.iloc[offset:offset + limit]
        page.attrs = {"total": len(jobs), "truncated": len(page) < len(jobs) - offset}
        return page

    def dead_letters(self) -> pd.DataFrame:
        jobs = jobs_frame(self._seen("dead_letters"))
        return jobs[jobs["state"] == "dead"][["job_id", "attempts", "last_error", "finished_at"]]

    def leases(self) -> pd.DataFrame:
        leases = leases_frame(self._seen("leases"))
        return leases[leases["outcome"] == "open"]

    def events(self, limit: int = 1000) -> pd.DataFrame:
        return events_frame(self._seen("events")).tail(limit)

    def pause(self) -> None:
        self.calls["pause"] = self.calls.get("pause", 0) + 1

    def resume(self) -> None:
        self.calls["resume"] = self.calls.get("resume", 0) + 1

    def close(self) -> None:
        self.calls["close"] = self.calls.get("close", 0) + 1


@pytest.fixture(scope="module")
def recorded() -> SimResult:
    """A run with retries and dead letters (half the tries fail, two attempts each)."""
    sim, until = scenario_from_params({**SMALL, "fail_p": 0.5, "max_attempts": 2, "seed": 3})
    return sim.run(until)


# -- the scenario builder ---------------------------------------------------------------------


def test_scenario_builder_declares_owner_workers_and_policy_without_running():
    sim, until = scenario_from_params({"workers": 3, "concurrency": 4, "clock_skew_s": 20.0,
                                       "lease_s": 7.0, "max_attempts": 6, "jobs": 30})
    assert list(sim.nodes) == ["owner", "worker-1", "worker-2", "worker-3"]
    config = sim.nodes["owner"].queues["jobs"]
    assert config.policy.lease_s == 7.0 and config.policy.max_attempts == 6
    skews = [sim.nodes[f"worker-{i}"].clock_skew_s for i in (1, 2, 3)]
    assert skews == [-20.0, 0.0, 20.0]
    assert until > (30 - 1) / DEFAULT_PARAMS["rate"]  # time for every arrival, then a tail
    assert sim.events == []  # built, not run
    result = sim.run(until)
    assert len(result.jobs) == 30 and result.check()["ok"].all()


def test_scenario_builder_rejects_unknown_and_invalid_parameters():
    with pytest.raises(ValueError, match="unknown scenario parameter.*'lease'"):
        scenario_from_params({"lease": 3})
    with pytest.raises(ValueError, match="workers must be >= 1"):
        scenario_from_params({"workers": 0})
    with pytest.raises(ValueError, match="rate must be > 0"):
        scenario_from_params({"rate": 0})


def test_crash_rate_zero_means_no_crashes_and_a_high_rate_crashes_workers():
    calm, until = scenario_from_params({**SMALL, "crashes_per_hour": 0})
    stormy, until2 = scenario_from_params({**SMALL, "crashes_per_hour": 60})
    calm_kinds = set(calm.run(until).events["kind"])
    stormy_events = stormy.run(until2).events
    crashed = stormy_events[stormy_events["kind"] == "crashed"]
    assert "crashed" not in calm_kinds
    assert len(crashed) > 0 and set(crashed["node"]) <= {"worker-1", "worker-2"}


# -- SimDashboard -----------------------------------------------------------------------------


def test_run_button_fills_progress_status_charts_and_tables():
    dash = SimDashboard()
    for name, value in SMALL.items():
        dash.controls[name].value = value
    assert dash.params["jobs"] == 40 and dash.params["workers"] == 2
    assert "40 jobs" in dash.scenario.value and "2 workers" in dash.scenario.value
    seen: list[int] = []
    dash.progress.observe(lambda change: seen.append(change["new"]), names="value")

    dash.button.click()

    assert dash.result is not None
    assert dash.progress.value == dash.progress.max
    assert len(seen) > 20 and seen == sorted(seen)  # followed virtual time, in many steps
    held = re.match(r"run finished: 40 jobs enqueued, (\d+)/(\d+) invariants hold",
                    dash.status.value)
    assert held and held[1] == held[2]  # every check the dashboard ran holds
    assert not dash.status.value.startswith("done")  # "done" is only ever a job state
    assert not dash.button.disabled
    assert all(h.layout.display == "none" for h in dash.panels.hints.values())  # tabs filled
    for name, image in dash.panels.images.items():
        height, width, _ = png_shape(image.value)
        assert width == 1200 and height > 300, name  # 12 in at 100 dpi, for every chart
        assert image.layout.display is None  # shown once drawn
        assert image.layout.width == "100%"  # sized to the pane, not to its pixels
    jobs = table_rows(dash.panels.tables["jobs"].value)
    assert len(jobs) == 40
    assert sorted(r[0] for r in jobs) == sorted(dash.result.jobs["job_id"])
    invariants = table_rows(dash.panels.tables["invariants"].value)
    assert len(invariants) == len(dash.result.check()) >= 10
    # Every check holds, or says n/a and why when the run had nothing for it (no chord here).
    assert all(row[1] == "✔ holds" or row[1].startswith("– n/a: ") for row in invariants)
    chord = next(row for row in invariants if row[0] == "chord callback fires exactly once")
    assert chord[1] == "– n/a: no chord in this run"
    assert dash.panels.tab.titles == ("leases", "retries", "backoff", "depth", "jobs",
                                      "invariants")
    dash.close()


def test_every_tab_says_what_to_do_before_the_first_run():
    dash = SimDashboard()
    assert set(dash.panels.hints) == {"leases", "retries", "backoff", "depth", "jobs",
                                      "invariants"}
    for name, hint in dash.panels.hints.items():
        assert "press Run" in hint.value and hint.layout.display != "none", name
    dash.close()


def test_the_run_horizon_is_a_control():
    dash = SimDashboard(SMALL)
    assert "auto" in dash.scenario.value
    dash.controls["horizon_s"].value = 30
    assert "runs to t=30 virtual s" in dash.scenario.value
    result = dash.run()
    assert result.virtual_s == pytest.approx(30, abs=1)
    assert "job states at t=30 s" in dash.status.value
    dash.close()


def test_status_jobs_tab_and_invariants_tab_use_the_same_words():
    # Short leases and failures: some jobs dead, one whose handler ran twice, and dead jobs
    # whose handler did finish once (dead by state, ok by the delivery check).
    dash = SimDashboard({**SMALL, "fail_p": 0.4, "max_attempts": 2, "lease_s": 2.0,
                         "seed": 3})
    result = dash.run()
    states = result.jobs["state"].value_counts()
    counts = result.counts
    status = dash.status.value
    assert (f": {states.get('done', 0)} done, {states.get('dead', 0)} dead, 0 unfinished"
            in status.split("job states at t=", 1)[1]), status
    assert (f"delivery check: ok {counts['ok']}, lost {counts['lost']}, "
            f"duplicated {counts['duplicated']}, pending {counts['pending']}") in status
    assert counts["duplicated"] > 0 and counts["ok"] > states["done"]  # the cases that confuse

    jobs_html = dash.panels.tables["jobs"].value
    rows = table_rows(jobs_html)
    assert f"{states.get('done', 0)} done, {states.get('dead', 0)} dead" in jobs_html
    state_col = [r[1] for r in rows]
    n_dead = state_col.count("dead")
    assert state_col[:n_dead] == ["dead"] * n_dead  # dead jobs first
    checks = [r[2] for r in rows]
    assert sum("ok" in c for c in checks) == counts["ok"]
    assert sum("duplicated" in c for c in checks) == counts["duplicated"]
    assert checks.count("pending") == counts["pending"]
    assert set(checks) <= {"ok", "ok, duplicated", "pending", "lost"}

    legend = dash.panels.tables["invariants"].value
    for word in ("ok", "lost", "duplicated", "pending"):
        assert f"<td><b>{word}</b></td><td>{counts[word]}</td>" in legend, word
    dash.close()


def test_progress_is_full_only_after_the_tabs_are_drawn(monkeypatch):
    dash = SimDashboard(SMALL)
    seen: list[tuple[int, bool]] = []
    dash.progress.observe(lambda change: seen.append(
        (change["new"], dash.panels.tables["invariants"].value != "")), names="value")
    dash.run()
    assert seen[-1] == (100, True)
    assert all(not tables_done for value, tables_done in seen if value <= 90)
    dash.close()


def test_charts_follow_the_controls_and_replay_for_the_same_controls():
    dash = SimDashboard(SMALL)
    first = dash.run()
    before = {name: image.value for name, image in dash.panels.images.items()}
    dash.run()  # same controls, same seed: the very same pictures
    assert {name: image.value for name, image in dash.panels.images.items()} == before
    dash.controls["jobs"].value = 80
    dash.controls["retry_backoff_max_s"].value = 1.5  # caps the policy band lower
    second = dash.run()
    assert len(first.jobs) == 40 and len(second.jobs) == 80
    for name, data in before.items():
        assert dash.panels.images[name].value != data, name
    assert len(table_rows(dash.panels.tables["jobs"].value)) == 80
    dash.close()


def test_jobs_table_is_capped_and_says_how_many_exist():
    df = pd.DataFrame({"job_id": [f"j{i}" for i in range(widgets.TABLE_ROWS + 50)]})
    fragment = table_html(df, "jobs")
    assert len(table_rows(fragment)) == widgets.TABLE_ROWS
    assert f"{widgets.TABLE_ROWS + 50} jobs, first {widgets.TABLE_ROWS} shown" in fragment


def test_a_failing_run_shows_the_error_and_reenables_the_button(monkeypatch):
    def broken(params: Any) -> Any:
        raise ValueError("no such scenario")

    monkeypatch.setattr(widgets, "scenario_from_params", broken)
    dash = SimDashboard(SMALL)
    dash.button.click()  # the handler must not raise into the kernel
    assert dash.status.value == "error: ValueError: no such scenario"
    assert not dash.button.disabled and dash.result is None
    with pytest.raises(ValueError, match="no such scenario"):
        dash.run()


def test_dashboard_displays_as_its_widget_and_close_closes_every_widget():
    dash = SimDashboard(SMALL)
    bundle = dash._repr_mimebundle_()
    view = bundle["application/vnd.jupyter.widget-view+json"]
    assert view["model_id"] == dash.widget.model_id
    dash.close()
    assert dash.widget.comm is None and dash.button.comm is None
    assert all(image.comm is None for image in dash.panels.images.values())


# -- LiveDashboard over a recorded stream -----------------------------------------------------


def test_live_refresh_fills_stats_charts_and_tables(recorded):
    fake = RecordedQueue(recorded, upto=len(recorded.events_raw) // 2)
    dash = LiveDashboard(fake, paused=True)
    assert not dash.ticking and fake.calls == {}  # paused: nothing fetched until asked
    dash.refresh()
    assert dash.refreshes == 1
    assert dash.stats_line.value.startswith("queue jobs on owner")
    assert "acked 1.5/s" in dash.stats_line.value
    assert dash.status.value.startswith("refreshed ")
    # Only the selected tab's chart is drawn at a refresh; another when its tab is selected.
    assert dash.panels.selected == "leases" and png_shape(dash.panels.images["leases"].value)
    assert all(image.value == b"" for name, image in dash.panels.images.items()
               if name != "leases")
    half = {}
    for name in ("leases", "retries", "depth"):
        dash.panels.tab.selected_index = list(dash.panels.tab.titles).index(name)
        half[name] = dash.panels.images[name].value
        assert png_shape(half[name])[0] > 100, name
    fake.advance(10_000)
    dash.refresh()  # "depth" is selected: drawn again now, the others when selected
    assert dash.panels.images["depth"].value != half["depth"]
    assert dash.panels.images["leases"].value == half["leases"]
    for name in ("leases", "retries"):
        dash.panels.tab.selected_index = list(dash.panels.tab.titles).index(name)
        assert dash.panels.images[name].value != half[name], name
    expected = recorded.jobs[recorded.jobs["state"] == "dead"]["job_id"]
    assert len(expected) > 0 and sorted(dash.dead_rows.ids()) == sorted(expected)
    assert dash.panels.tab.titles[-8:] == ("jobs", "dead letters", "job", "workers", "latency",
                                           "batches", "dependencies", "replay")
    assert "istos-latency" in dash.panels.tables["latency"].value
    dash.close()
    assert fake.calls.get("close") is None  # the dashboard does not own the client


def test_live_timer_refreshes_until_paused_and_resumes(recorded):
    fake = RecordedQueue(recorded, upto=40)
    dash = LiveDashboard(fake, refresh_s=0.1, paused=True)
    dash.panels.show_charts = lambda *args, **kw: None  # timing is under test here, not drawing
    try:
        assert not dash.ticking
        dash.resume()
        assert dash.ticking
        wait_for(lambda: dash.refreshes >= 2, what="two timed refreshes")
        dash.pause()
        assert dash.pause_toggle.value and not dash.ticking
        assert dash.status.value == "paused"
        # (a tick asks for the stats first: the rest only when they moved, see test_dashboard_idle)
        frozen = fake.calls["stats"]
        time.sleep(0.5)  # five intervals: a live timer would have fetched again
        assert fake.calls["stats"] == frozen
        dash.resume()
        wait_for(lambda: fake.calls["stats"] > frozen, what="a refresh after resume")
        dash.interval.value = 0.2  # restarts the timer at the new interval
        assert dash.ticking
    finally:
        dash.close()
    assert not dash.ticking
    settled = fake.calls["stats"]
    time.sleep(0.3)
    assert fake.calls["stats"] == settled


def test_live_refresh_error_is_shown_and_the_timer_keeps_trying(recorded):
    fake = RecordedQueue(recorded, upto=40)
    fake.fail_with = ConnectionError("owner unreachable")
    dash = LiveDashboard(fake, refresh_s=0.1)
    try:
        wait_for(lambda: dash.status.value.startswith("error: ConnectionError"),
                 what="the error in the status")
        assert dash.ticking
        fake.fail_with = None
        wait_for(lambda: dash.refreshes >= 1, what="a refresh once the owner is back")
        with pytest.raises(ConnectionError):
            fake.fail_with = ConnectionError("down again")
            dash.refresh()  # a direct refresh raises to its caller
    finally:
        dash.close()


# -- LiveDashboard against a real owner over Zenoh --------------------------------------------


async def test_live_dashboard_against_a_real_owner_over_zenoh():
    attach_mod = pytest.importorskip("istos_nb.live.attach")
    from helpers import count, wait_events
    from zenoh_util import isolated_configs, unique_prefix

    from istos import Istos

    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q", max_attempts=2, retry_backoff_s=0.01, retry_jitter=0.0)

    @owner.worker("q", concurrency=2, poll_interval_s=0.1)
    async def work(job):
        if job["fail"]:
            raise RuntimeError("always fails")

    async with owner.serving():
        for i in range(6):
            await owner.enqueue("q", {"i": i, "fail": i == 0})
        await wait_events(owner, lambda ev: count(ev, "acked") == 5
                          and count(ev, "dead_lettered") == 1, timeout_s=15)
        # From threads, as the dashboard's own timer calls (plain calls on this loop work too:
        # test_live_dashboard.py).
        lq = await asyncio.to_thread(attach_mod.attach, "q", configs[1], prefix=prefix)
        dash = LiveDashboard(lq, refresh_s=0.2)
        try:
            for _ in range(200):  # bounded: 20 s
                if dash.refreshes >= 1:
                    break
                await asyncio.sleep(0.1)
            assert dash.refreshes >= 1, dash.status.value
            await asyncio.to_thread(dash.pause)
            assert "queue q on owner" in dash.stats_line.value
            assert "dead 1" in dash.stats_line.value
            dead = [row.cells.value for row in dash.dead_rows.rows if row.job_id]
            assert len(dead) == 1 and "always fails" in dead[0]
            for index, name in enumerate(dash.panels.images):  # each drawn when selected
                dash.panels.tab.selected_index = index
                assert png_shape(dash.panels.images[name].value)[0] > 100, name
        finally:
            await asyncio.to_thread(dash.close)
            await asyncio.to_thread(lq.close)
