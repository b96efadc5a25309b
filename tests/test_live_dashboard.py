"""LiveDashboard against a real owner over Zenoh: the queue's own policy (and max_attempts) in the
backoff tab, one time span ending at now for every time chart, the Jobs tab's state filter,
search, pages and "N–M of T", readable tables ("–" for a dead job's ready / lease time), job
detail, dead letters with per-row actions, and admin actions only with admin=True, each behind
a confirmation whose outcome outlives the next refresh. Plus the pure helpers (tables, pager,
the charts' window)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import numpy as np
import pandas as pd
import pytest
from helpers import count, wait_events
from matplotlib.dates import date2num
from zenoh_util import isolated_configs, unique_prefix

from istos import Istos, JobContext
from istos_nb import LiveDashboard, attach
from istos_nb.data.frames import events_frame
from istos_nb.views import charts
from istos_nb.views import livetables as lt
from istos_nb.views.live_dashboard import MIN_SPAN_S, SERIES_WINDOW, chart_window, parse_search
from istos_nb.views.pager import Pager
from istos_nb.views.series_charts import series_depth_chart, series_throughput_chart


def rows(html: str) -> list[str]:
    return re.findall(r"<tr>(.*?)</tr>", html.split("<tbody>", 1)[1], flags=re.S)


def column(html: str, name: str) -> list[str]:
    """The text of column ``name`` in every row of a livetables table."""
    header = re.findall(r"<th>(.*?)</th>", html.split("<tbody>", 1)[0])
    i = header.index(name)
    return [re.findall(r"<td[^>]*>(.*?)</td>", r)[i] for r in rows(html)]


async def test_live_dashboard_policy_jobs_tab_detail_and_confirmed_admin():
    configs, prefix = isolated_configs(3), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q", max_attempts=2, retry_backoff_s=0.5, retry_backoff_max_s=2.0,
                retry_jitter=0.2, admin=True)
    worker = Istos(zenoh=configs[2], prefix=prefix, node_id="wk")

    @worker.worker("q", concurrency=2, poll_interval_s=0.1)
    async def work(job: dict, ctx: JobContext) -> None:
        if job.get("fail"):
            raise RuntimeError("always fails")

    await owner.start()
    try:
        dead_id = await owner.enqueue("q", {"fail": True, "to": {"user": "x" * 200}})
        async with worker.serving():
            await wait_events(owner, lambda ev: count(ev, "dead_lettered") == 1, timeout_s=15)
        done_id = await owner.enqueue("q", {"n": 0})  # no worker now: stays ready
        ids = [await owner.enqueue("q", {"n": i, "tag": "a" if i % 2 else "b"})
               for i in range(1, 7)]
        lq = attach("q", configs[1], prefix=prefix)  # plain calls, owner on this loop
        dash = LiveDashboard(lq, paused=True, page_rows=3)
        drawn: list[Any] = []
        show = dash.panels.show_charts

        def record(events: Any, backoff: tuple[float, float, float], **kw: Any) -> None:
            drawn.append((backoff, kw))
            # depth and throughput from the owner's series, not from the event window
            assert set(kw["drawn_by"]) == {"depth", "throughput"}
            if len(drawn) == 1:  # draw once: each refresh below would redraw five charts
                show(events, backoff, **kw)

        dash.panels.show_charts = record
        try:
            before = pd.Timestamp.now(tz="UTC").timestamp()
            dash.refresh()
            after = pd.Timestamp.now(tz="UTC").timestamp()
            backoff, kw = drawn[-1]
            assert backoff == (0.5, 2.0, 0.2)  # the queue's policy, not the defaults
            assert kw["max_attempts"] == 2  # the band stops where the queue stops retrying
            start, end = kw["window"]  # one span for every time chart, ending at the refresh
            assert before <= end <= after and end - start >= MIN_SPAN_S
            assert dash.window == kw["window"]
            for name in ("depth", "throughput"):  # the series charts span exactly it
                lo, hi = kw["drawn_by"][name]().axes[0].get_xlim()
                assert hi == pytest.approx(charts_date(end), abs=1e-9)
                assert lo == pytest.approx(charts_date(start), abs=1e-9)
            assert "UTC (now)" in dash.window_line.value
            # The Jobs tab, a page of 3 at a time: 7 ready + 1 dead, not done.
            assert "1–3 of 8 jobs" in dash.panels.tables["jobs"].value
            assert dash.jobs_pager.prev.disabled and not dash.jobs_pager.next.disabled
            dash.jobs_pager.next.click()  # the pager refreshes
            assert "4–6 of 8 jobs" in dash.panels.tables["jobs"].value
            dash.jobs_pager.next.click()
            assert "7–8 of 8 jobs" in dash.panels.tables["jobs"].value
            assert dash.jobs_pager.next.disabled and not dash.jobs_pager.prev.disabled
            page3 = [r for r in rows(dash.panels.tables["jobs"].value)]
            assert len(page3) == 2 and ids[-1] in page3[-1]
            dash.jobs_pager.prev.click()
            assert "4–6 of 8 jobs" in dash.panels.tables["jobs"].value
            dash.jobs_pager.reset()
            dash.jobs_pager.size = 200
            dash.refresh()
            jobs_html = dash.panels.tables["jobs"].value
            assert "1–8 of 8 jobs" in jobs_html
            assert not re.search(r"1\.[0-9]{9}e\+09|17[0-9]{8}\.[0-9]", jobs_html)  # no epochs
            table = rows(jobs_html)
            assert len(table) == 8 and dead_id in table[0]  # oldest first
            due = column(jobs_html, "ready / lease ends")
            assert due[0] == lt.NO_TIME  # a dead job has no ready or lease time
            assert all(d != lt.NO_TIME for d in due[1:])  # a ready job: since when
            payload = re.search(r'class="istos-payload" title="([^"]*)">([^<]*)<', table[0])
            assert payload and payload.group(2).endswith("…") and "\n" not in payload.group(2)
            assert dash.dead_rows.ids() == [dead_id]
            dead_row = dash.dead_rows.rows[0]
            assert "always fails" in dead_row.cells.value
            assert "1–1 of 1 dead letters" in dash.dead_rows.note.value
            assert "admin" in dash.stats_line.value
            panel = dash.admin_panel
            assert dash.admin and panel.row.layout.display is None
            assert dead_row.resubmit.layout.display is None  # admin: the row's actions shown
            dead_row.show.click()  # the row's Show: that job in the job tab
            assert dash.panels.tab.titles[dash.panels.tab.selected_index] == "job"
            assert dash.job_id.value == dead_id and "always fails" in dash.detail.value

            dash.state_filter.value = "dead"  # observing the filter refreshes
            assert "1–1 of 1 jobs" in dash.panels.tables["jobs"].value
            dash.state_filter.value = "ready"
            dash.search.value = 'tag="a"'
            assert len(rows(dash.panels.tables["jobs"].value)) == 3
            dash.search.value = ""

            dash.job_id.value = dead_id
            dash.show_selected_job()
            detail = dash.detail.value
            assert "always fails" in detail and "2 attempt(s)" in detail
            assert len(rows(detail.split("istos-history", 1)[1])) == 2
            assert dash.timeline.layout.display is None  # the job's retry timeline drawn

            # Nothing is sent before the confirmation; "No, keep" sends nothing at all.
            dash.ask("pause")
            assert panel.confirm_box.layout.display is None
            assert panel.yes.description == "Yes, pause" and panel.no.description == "No, keep"
            assert lq.stats()["paused"] is False
            dash.cancel()
            assert lq.stats()["paused"] is False and panel.confirm_box.layout.display == "none"
            assert "kept: nothing sent" in dash.message.value
            # A dead letter's own Resubmit button: the same confirmation, for that row's job.
            dash.job_id.value = ""
            dead_row.resubmit.click()
            assert dead_id in panel.text.value and panel.yes.description == "Yes, resubmit"
            assert dash.message.value == ""  # a new question: the old outcome is gone
            assert lq.why(dead_id)["state"] == "dead"  # nothing sent yet
            panel.yes.click()
            assert "done: Resubmit dead job" in dash.message.value
            new_id = re.search(r"→ (\S+)", dash.message.value).group(1)  # type: ignore[union-attr]
            assert new_id not in (dead_id, done_id, *ids)
            assert (lq.jobs(state="ready", limit=None).job_id == new_id).any()
            status = dash.status.value
            dash.refresh()  # the outcome outlives refreshes; the status line moves on
            assert new_id in dash.message.value and "done: Resubmit" not in dash.status.value
            assert status.startswith("refreshed")
            with pytest.warns(DeprecationWarning, match="'resubmit'"):
                dash.ask("requeue", dead_id)  # the action's old name, kept one release
            assert panel.pending is not None and panel.pending.action == "resubmit"
            dash.cancel()
            dash.job_id.value = new_id
            dash.ask("cancel-job")
            assert new_id in panel.text.value
            assert panel.yes.description == "Yes, cancel the job"  # never a bare "Cancel"
            assert dash.confirm() == "cancelled"
            assert lq.why(new_id)["state"] == "cancelled"
            panel.reason.value = " smtp down "  # the field beside Pause: sent as the reason
            dash.ask("pause")
            assert "(reason: smtp down)" in panel.text.value
            dash.confirm()
            stats = lq.stats()
            assert stats["paused"] is True and "PAUSED" in dash.stats_line.value
            assert stats["pause"]["reason"] == "smtp down"
        finally:
            dash.close()
            lq.close()
    finally:
        await owner.stop()


class _Pauses:
    """Records what the admin panel's Pause sends (a stand-in for the LiveQueue)."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []

    def pause(self, *args: Any) -> dict[str, Any]:
        self.sent.append(args)
        return {}

    def resume(self) -> bool:
        return True


@pytest.mark.fast
def test_pause_sends_the_reason_field_only_when_it_holds_one():
    from istos_nb.views.admin_panel import AdminPanel

    lq = _Pauses()
    panel = AdminPanel(lq, lambda: "", lambda: None)
    panel.set_admin(True)
    assert panel.reason in panel.row.children and "istos-admin-reason" in panel.reason._dom_classes
    for typed in ("", "   ", "deploy"):
        panel.reason.value = typed
        panel.ask("pause")
        panel.reason.value = "typed after the question"  # what was confirmed is what is sent
        panel.confirm()
    assert lq.sent == [(), (), ("deploy",)]


async def test_admin_actions_are_hidden_and_refused_without_admin():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    async with owner.serving():
        lq = attach("q", configs[1], prefix=prefix)
        dash = LiveDashboard(lq, paused=True)
        try:
            dash.refresh()
            assert dash.admin is False and dash.admin_panel.row.layout.display == "none"
            with pytest.raises(PermissionError, match="admin=True"):
                dash.ask("pause")
            assert dash.admin_panel.confirm_box.layout.display == "none"
            assert "no jobs" in dash.panels.tables["jobs"].value
        finally:
            dash.close()
            lq.close()
        await asyncio.sleep(0)


def test_table_helpers_read_like_a_person_would():
    now = pd.Timestamp("2026-12-01 10:00:00", tz="UTC")
    assert lt.age(now - pd.Timedelta(minutes=3), now) == "3 min"
    assert lt.age(now + pd.Timedelta(seconds=2), now) == "in 2.0 s"
    assert lt.age(pd.NaT, now) == "" and lt.local_time(None, now) == ""
    assert re.fullmatch(r"\d\d:\d\d:\d\d", lt.local_time(now - pd.Timedelta(seconds=5), now))
    assert lt.compact({"a": [1, 2], "b": {"c": "ü"}}) == '{"a":[1,2],"b":{"c":"ü"}}'
    assert lt.page_note(200, 5123, "jobs") == "1–200 of 5,123 jobs"
    assert lt.page_note(0, 0, "jobs") == "no jobs"
    assert parse_search('user.id=7, to=a@b.com ok=true') == {"user.id": 7, "to": "a@b.com",
                                                             "ok": True}
    with pytest.raises(ValueError, match="key=value"):
        parse_search("oops")
    assert lt.page_note(2, 8, "jobs", offset=6) == "7–8 of 8 jobs"
    assert lt.page_note(200, None, "jobs", offset=200) == "201–400 of more than 400 jobs"
    for state in ("dead", "done", "cancelled"):  # no ready or lease time: "–", never "3 min"
        assert lt._due({"state": state, "ready_at": now - pd.Timedelta(minutes=3)},
                       now) == lt.NO_TIME
    assert lt._due({"state": "leased", "deadline": now + pd.Timedelta(seconds=2)},
                   now) == "in 2.0 s"


def charts_date(epoch_s: float) -> float:
    """``epoch_s`` as matplotlib's date number (the series charts' x)."""
    return float(date2num(pd.Timestamp(epoch_s, unit="s", tz="UTC").tz_localize(None)))


def test_pager_moves_by_pages_and_clamps_when_rows_leave():
    moved: list[int] = []
    pager = Pager("jobs", 10, lambda: moved.append(pager.offset))
    pager.shown(10, 25)
    assert pager.prev.disabled and not pager.next.disabled
    pager.next.click()
    pager.next.click()
    assert moved == [10, 20]
    pager.shown(5, 25)
    assert pager.next.disabled and not pager.prev.disabled
    pager.move(-5)
    assert pager.offset == 0 and moved == [10, 20, 0]
    pager.move(-1)  # already on the first page: nothing to do
    assert moved == [10, 20, 0]
    pager.offset = 20
    assert pager.clamp(12) and pager.offset == 10  # the queue drained under the page
    assert not pager.clamp(None) and not pager.clamp(25)
    pager.shown(7, None)  # total unknown: a short page is the last
    assert pager.next.disabled
    with pytest.raises(ValueError, match="page size"):
        Pager("jobs", 0, lambda: None)


def test_live_charts_share_one_window_ending_at_now_on_a_wall_clock():
    now = 1_764_600_000.0
    events = [
        {"t": now - 30, "kind": "enqueued", "job_id": "a", "queue": "q", "node": "o"},
        {"t": now - 29, "kind": "claimed", "job_id": "a", "queue": "q", "node": "o",
         "attempt": 1, "worker": "w:f#0", "detail": {"deadline": now + 60}},
    ]
    frame = events_frame(events)
    window = chart_window(frame, now)
    assert window == (now - MIN_SPAN_S, now)  # at least the last minute, up to now
    old = events_frame([{**events[0], "t": now - 3600}])
    assert chart_window(old, now) == (now - SERIES_WINDOW.total_seconds(), now)
    assert chart_window(events_frame([{**events[0], "t": 5.0}]), now) is None
    for draw in (charts.lease_gantt, charts.retry_timeline, charts.depth_chart,
                 charts.throughput_chart):
        ax = draw(frame, window=window).axes[0]
        assert ax.get_xlim() == (0.0, MIN_SPAN_S), draw.__name__  # seconds since the start
        assert ax.get_xlabel() == "wall-clock time (UTC)"
        labels = [t.get_text() for t in ax.get_xticklabels()]
        fmt = ax.xaxis.get_major_formatter()
        shown = [fmt(x) for x in ax.get_xticks() if 0 <= x <= MIN_SPAN_S]
        assert shown and all(re.fullmatch(r"\d\d:\d\d:\d\d", s) for s in shown), labels
    gantt = charts.lease_gantt(frame, window=window).axes[0]
    bar = next(c for c in gantt.collections if c.get_gid() == "leases").get_paths()[0]
    assert bar.vertices[:, 0].max() == pytest.approx(MIN_SPAN_S)  # the open lease: up to now
    empty = charts.lease_gantt([], window=window).axes[0]
    assert empty.get_xlim() == (0.0, MIN_SPAN_S)
    with pytest.raises(ValueError, match="start < end"):
        charts.depth_chart(frame, window=(now, now - 1))
    # The owner's series, on the same span: the last bucket's counts held until now.
    t = pd.date_range(pd.Timestamp(now - 40, unit="s", tz="UTC"), periods=30, freq="1s",
                      name="t")
    series = pd.DataFrame({c: np.arange(30) % 5 for c in
                           ("ready", "leased", "delayed", "dead", "enqueued", "acked", "nacked",
                            "expired", "dead_lettered")}, index=t)
    for draw in (series_depth_chart, series_throughput_chart):
        ax = draw(series, window=window).axes[0]
        assert ax.get_xlim() == pytest.approx((charts_date(window[0]), charts_date(now)))
        assert ax.get_xlabel() == "wall-clock time (UTC)"
        line = ax.lines[0]
        assert float(date2num(line.get_xdata()[-1])) == pytest.approx(charts_date(now))
        fmt = ax.xaxis.get_major_formatter()
        assert re.fullmatch(r"\d\d:\d\d:\d\d", fmt(charts_date(now - 10)))


def test_backoff_band_stops_at_the_queues_max_attempts():
    for max_attempts in (2, 3, 5):
        ax = charts.backoff_curve([], 1.0, 600.0, 0.1, max_attempts=max_attempts).axes[0]
        band = next(c for c in ax.collections if c.get_gid() == "backoff_band")
        # the last attempt never retries: the band's last strip is attempt max_attempts - 1
        assert band.get_paths()[0].vertices[:, 0].max() == pytest.approx(
            max_attempts - 1 + 0.35)


class QuietQueue:
    """An idle queue: what a refresh asks, answered with nothing."""

    queue = "q"

    def stats(self) -> dict[str, Any]:
        return {"queue": "q", "node": "owner", "counts": {}, "policy": {"max_attempts": 3}}

    def raw_events(self, limit: int) -> list[dict[str, Any]]:
        return []

    def jobs(self, state: Any = None, limit: int = 100, offset: int = 0) -> pd.DataFrame:
        page = pd.DataFrame({"job_id": pd.Series([], dtype=object)})
        page.attrs = {"total": 0}
        return page

    def dead_letters(self) -> pd.DataFrame:
        return pd.DataFrame({"job_id": pd.Series([], dtype=object)})


def test_page_timer_ticks_queued_behind_a_refresh_are_dropped():
    dash = LiveDashboard(QuietQueue(), refresh_s=2.0, paused=True, page_timer=True)
    dash.panels.show_charts = lambda *args, **kw: None  # ticks are under test, not drawing
    try:
        dash._pulse.value += 1  # the page's timer ticks: a refresh
        assert dash.refreshes == 1 and dash.status.value.startswith("refreshed")
        dash._pulse.value += 1  # queued while it ran: arrives at once, dropped
        dash._pulse.value += 1
        assert dash.refreshes == 1
        dash._done_at -= 1.0  # as if that refresh ended half an interval ago: the next runs
        dash._pulse.value += 1
        assert dash.refreshes == 2
        dash.refresh()  # an explicit refresh (a click) always runs
        assert dash.refreshes == 3
        assert dash.window is not None and dash.window[1] - dash.window[0] == MIN_SPAN_S
    finally:
        dash.close()
