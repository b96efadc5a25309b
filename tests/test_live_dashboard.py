"""LiveDashboard against a real owner over Zenoh: the queue's own policy in the backoff tab, the
Jobs tab's state filter, search and "1–N of M", readable tables, job detail, and admin actions
only with admin=True, each behind a confirmation. Plus the pure table helpers."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pandas as pd
import pytest
from helpers import count, wait_events
from zenoh_util import isolated_configs, unique_prefix

from istos import Istos, JobContext
from istos_nb import LiveDashboard, attach
from istos_nb.views import livetables as lt
from istos_nb.views.live_dashboard import parse_search


def rows(html: str) -> list[str]:
    return re.findall(r"<tr>(.*?)</tr>", html.split("<tbody>", 1)[1], flags=re.S)


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
        dash = LiveDashboard(lq, paused=True)
        drawn: list[Any] = []
        show = dash.panels.show_charts

        def record(events: Any, backoff: tuple[float, float, float], **kw: Any) -> None:
            drawn.append(backoff)
            assert kw.get("depth") is not None  # depth from the owner's series, not events
            if len(drawn) == 1:  # draw once: each refresh below would redraw four charts
                show(events, backoff, **kw)

        dash.panels.show_charts = record
        try:
            dash.refresh()
            assert drawn[-1] == (0.5, 2.0, 0.2)  # the queue's policy, not the defaults
            jobs_html = dash.panels.tables["jobs"].value
            assert "1–8 of 8 jobs" in jobs_html  # not done: 7 ready + 1 dead
            assert not re.search(r"1\.[0-9]{9}e\+09|17[0-9]{8}\.[0-9]", jobs_html)  # no epochs
            table = rows(jobs_html)
            assert len(table) == 8 and dead_id in table[0]  # oldest first
            payload = re.search(r'class="istos-payload" title="([^"]*)">([^<]*)<', table[0])
            assert payload and payload.group(2).endswith("…") and "\n" not in payload.group(2)
            assert "always fails" in dash.panels.tables["dead letters"].value
            assert "admin" in dash.stats_line.value
            assert dash.admin and dash.admin_row.layout.display is None

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

            # Nothing is sent before the confirmation; cancel sends nothing at all.
            dash.ask("pause")
            assert dash.confirm_box.layout.display is None
            assert lq.stats()["paused"] is False
            dash.cancel()
            assert lq.stats()["paused"] is False and dash.confirm_box.layout.display == "none"
            dash.ask("requeue")
            assert dead_id in dash.confirm_text.value
            new_id = dash.confirm()
            assert new_id not in (dead_id, done_id, *ids)
            assert (lq.jobs(state="ready", limit=None).job_id == new_id).any()
            dash.job_id.value = new_id
            dash.ask("cancel-job")
            assert new_id in dash.confirm_text.value
            assert dash.confirm() == "cancelled"
            assert lq.why(new_id)["state"] == "cancelled"
            dash.ask("pause")
            dash.confirm()
            assert lq.stats()["paused"] is True and "PAUSED" in dash.stats_line.value
        finally:
            dash.close()
            lq.close()
    finally:
        await owner.stop()


async def test_admin_actions_are_hidden_and_refused_without_admin():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("q")
    async with owner.serving():
        lq = attach("q", configs[1], prefix=prefix)
        dash = LiveDashboard(lq, paused=True)
        try:
            dash.refresh()
            assert dash.admin is False and dash.admin_row.layout.display == "none"
            with pytest.raises(PermissionError, match="admin=True"):
                dash.ask("pause")
            assert dash.confirm_box.layout.display == "none"
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
