"""Operators see batches: ``batch`` events at the home, the dashboard's Batches tab (its HTML
builders, pure; and a LiveDashboard over real Zenoh showing a live batch and its members)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pandas as pd
import pytest
from helpers import app_on, wait_events
from test_batch import Callbacks, declare
from test_batch_zenoh import cli
from zenoh_util import isolated_configs, unique_prefix

from istos import Istos, JobContext
from istos_nb import LiveDashboard, attach
from istos_nb.views import batchview as bv

NOW = pd.Timestamp("2026-12-04 12:00:00", tz="UTC")


@pytest.mark.fast
async def test_batch_events_say_opened_closed_fired_finished(mesh):
    app, cbs = app_on(mesh, "solo"), Callbacks()
    declare(app, cbs, fail={1})
    async with app.serving():
        batch = await app.batch(on_success=("cb", 1), on_complete=("cb", 2),
                                on_death=("cb", 3))
        for n in range(3):
            await batch.add("abc"[n], n)
        await batch.close()
        await cbs.wait("on_complete", "on_death")
        events = await wait_events(app, lambda evs: sum(
            e.kind == "batch" and e.detail["change"] == "fired" for e in evs) >= 2)
    mine = [e for e in events if e.kind == "batch" and e.detail["batch_id"] == batch.id]
    changes = [e.detail["change"] for e in mine]
    assert changes[:2] == ["opened", "closed"] and changes.count("finished") == 1
    fired = sorted(e.detail["callback"] for e in mine if e.detail["change"] == "fired")
    assert fired == ["on_complete", "on_death"]
    finished = next(e for e in mine if e.detail["change"] == "finished")
    assert (finished.detail["total"], finished.detail["dead"], finished.detail["pending"]) \
        == (3, 1, 0)
    assert all(e.job_id == "" and e.queue == "cb" for e in mine)  # names no job


@pytest.mark.fast
def test_batches_table_shows_state_counts_and_callbacks():
    frame = pd.DataFrame([
        {"batch_id": "wf:1@cb", "description": "nightly <b>", "closed": True, "total": 3,
         "pending": 1, "done": 1, "dead": 1, "cancelled": 0,
         "created_at": NOW.timestamp() - 60, "finished_at": None,
         "callbacks": {"on_death": {"queue": "cb", "fired_at": NOW.timestamp() - 5},
                       "on_complete": {"queue": "cb", "fired_at": None}}},
        {"batch_id": "wf:2@cb", "description": "", "closed": False, "total": 0, "pending": 0,
         "done": 0, "dead": 0, "cancelled": 0, "created_at": NOW.timestamp(),
         "finished_at": None, "callbacks": {}}])
    html = bv.batches_html(frame, NOW, total=5)
    assert "istos-batches" in html and "2 batch(es) of 5" in html
    assert "nightly &lt;b&gt;" in html  # escaped
    first = re.findall(r"<tr>(.*?)</tr>", html.split("<tbody>", 1)[1], flags=re.S)[0]
    cells = re.findall(r"<td>(.*?)</td>", first)
    assert cells[2] == "closed" and cells[3:8] == ["3", "1", "1", "1", "0"]
    assert cells[8] == "-" and cells[9] == "waits (cb)" and cells[10].startswith("fired 5")
    assert bv.batch_state({"closed": True, "finished_at": 1.0}) == "finished"
    members = pd.DataFrame([{"job_id": "j1", "queue": "a", "state": "done"},
                            {"job_id": "j2", "queue": "b", "state": "pending"}])
    shown = bv.members_html(members, "wf:1@cb", more=True)
    assert "istos-batch-members" in shown and "1 done, 1 pending" in shown and "(more)" in shown


async def test_the_dashboard_shows_a_live_batch_and_its_members():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("cb")
    owner.queue("work")
    gate = asyncio.Event()

    @owner.worker("work", concurrency=4)
    async def work(n: int, ctx: JobContext) -> None:
        if n >= 2:
            await gate.wait()  # two done, two still running while the dashboard looks

    lq: Any = None
    async with owner.serving():
        batch = await owner.batch(on_success=("cb", "ok"), on_complete=("cb", "all"),
                                  description="four jobs")
        ids = [await batch.add("work", n) for n in range(4)]
        child = await batch.batch(home="cb", description="an empty child")
        await child.close()  # empty: done at once, and done in its parent
        await batch.close()
        await wait_events(owner, lambda evs: sum(e.kind == "acked" for e in evs) >= 2)
        lq = attach("cb", configs[1], prefix=prefix)
        try:
            dash = LiveDashboard(lq, paused=True)
            await asyncio.to_thread(dash.refresh)
            table, members = dash.batches_table.value, dash.members_table.value
            assert "batches" in list(dash.panels.tab.titles)
            frame = await lq.abatches()
            endpoints = [cfg["listen"]["endpoints"][0] for cfg in configs]
            shown = await cli(["batch", child.id], endpoints, prefix)
        finally:
            gate.set()
            await asyncio.to_thread(lq.close)
    assert batch.id in table and "four jobs" in table and "closed" in table
    assert "waits (cb)" in table  # neither callback fired yet
    assert all(j in members for j in ids) and "3 done, 2 pending" in members  # (the child)
    assert child.id in members and "an empty child" in table
    assert frame.attrs["total"] == 2 and frame.loc[0, "pending"] == 2
    assert f"a member of batch {batch.id}" in shown and "0 members" in shown


@pytest.mark.fast
@pytest.mark.parametrize("limit", [0, 1001, -1, 1.5, "10", None, True])
def test_a_bad_batches_limit_is_refused_before_anything_is_sent(limit: Any):
    from istos import ConfigError
    from istos_nb.live.attach import _check_batch_limit

    with pytest.raises(ConfigError):
        _check_batch_limit(limit)
