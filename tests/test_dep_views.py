"""Operators see dependencies: the dashboard's Dependencies tab (its HTML builder, pure; and a
LiveDashboard over real Zenoh showing a child waiting on its parent, the child leaving the
table once the parent is acked, and the tab saying so when the owner cannot be read)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pandas as pd
import pytest
from helpers import wait_events
from zenoh_util import isolated_configs, unique_prefix

from istos import Istos, JobContext
from istos_nb import LiveDashboard, attach
from istos_nb.views import depview as dv

NOW = pd.Timestamp("2026-12-04 12:00:00", tz="UTC")


def rows(html: str) -> list[list[str]]:
    """The table's rows as lists of cell texts (tags dropped, ``<br>`` as a newline)."""
    body = html.split("<tbody>", 1)[1]
    return [[re.sub(r"<[^>]+>", "", c.replace("<br>", "\n"))
             for c in re.findall(r"<td>(.*?)</td>", tr)]
            for tr in re.findall(r"<tr>(.*?)</tr>", body)]


def waits(*parents: tuple[str, str, str], mode: str = "cancel",
          needs_operator: bool = False) -> dict[str, Any]:
    return {"state": "waiting", "waits_for": {
        "parents": [{"queue": q, "job_id": j, "state": s} for q, j, s in parents],
        "on_parent_failure": mode, "needs_operator": needs_operator,
        "pending": sum(s == "pending" for _q, _j, s in parents)}}


@pytest.mark.fast
def test_deps_table_shows_parents_mode_and_operator():
    jobs = pd.DataFrame({"job_id": ["c1", "c2<x>", "c3"],
                         "enqueued_at": [NOW - pd.Timedelta(seconds=30),
                                         NOW - pd.Timedelta(minutes=5), NOW]})
    whys = {"c1": waits(("a", "p1", "pending"), ("b", "p2", "done")),
            "c2<x>": waits(("a", "p3", "dead"), mode="wait", needs_operator=True),
            "c3": {"state": "ready"}}  # released between the listing and its why
    html = dv.deps_html(jobs, whys, NOW, total=7)
    assert "istos-deps" in html and "3 waiting job(s) of 7" in html
    assert "1 need(s) an operator" in html and "c2&lt;x&gt;" in html  # escaped
    table = rows(html)
    assert table[0] == ["c1", "30.0 s ago", "a/p1: pending\nb/p2: done", "cancel", "no"]
    assert table[1][2:] == ["a/p3: dead", "wait", "yes: a parent failed"]
    assert table[2][2:] == ["now ready", "-", "-"]
    assert "no need" not in dv.deps_html(jobs.iloc[:1], whys, NOW)
    assert rows(dv.deps_html(jobs.iloc[:0], {}, NOW, total=0)) == []


async def test_the_dashboard_shows_a_waiting_child_until_its_parent_is_acked():
    configs, prefix = isolated_configs(2), unique_prefix()
    owner = Istos(zenoh=configs[0], prefix=prefix, node_id="owner")
    owner.queue("p")
    owner.queue("c")
    gate = asyncio.Event()

    @owner.worker("p")
    async def parent(n: int, ctx: JobContext) -> None:
        await gate.wait()  # the parent stays pending while the dashboard looks

    @owner.worker("c")
    async def child(n: int, ctx: JobContext) -> None:
        return None

    lq: Any = None
    try:
        async with owner.serving():
            first = await owner.enqueue("p", 1)
            later = await owner.enqueue("p", 2, delay_s=3600)  # pending all along
            kid = await owner.enqueue("c", 1, after=[first])
            other = await owner.enqueue("c", 2, after=[("p", later)], on_parent_failure="wait")
            lq = attach("c", configs[1], prefix=prefix, timeout_s=1.0)
            dash = LiveDashboard(lq, paused=True)
            await asyncio.to_thread(dash.refresh)
            before = rows(dash.deps_table.value)
            assert "dependencies" in list(dash.panels.tab.titles)
            gate.set()
            await wait_events(owner, lambda evs: any(
                e.kind == "acked" and e.job_id == kid for e in evs), timeout_s=10.0)
            await asyncio.to_thread(dash.refresh)
            after = rows(dash.deps_table.value)
        await asyncio.to_thread(dash._show_deps, lq, NOW)  # the owner is gone
        gone = dash.deps_table.value
    finally:
        gate.set()
        if lq is not None:
            await asyncio.to_thread(lq.close)
    by_id = {r[0]: r for r in before}
    assert set(by_id) == {kid, other}
    assert by_id[kid][2:] == [f"p/{first}: pending", "cancel", "no"]
    assert by_id[other][2:] == [f"p/{later}: pending", "wait", "no"]
    assert [r[0] for r in after] == [other]  # the child whose parent was acked left
    assert gone.startswith("dependencies: OwnerUnavailable") and other not in gone
