"""``istos dashboard`` in a real browser: the CLI serves the LiveDashboard through Voila, headless
Chromium opens it against a live owner behind a Zenoh router with a backlog of 254 jobs: the
Jobs tab pages past its first 200, a dead job shows "–" (no ready or lease time), the time
charts end at the refresh instant, one job is shown in detail, and admin actions go through
their confirmation right under the admin row ("No, keep" sends nothing; a dead letter's own
Resubmit button and "Yes, resubmit" resubmit it) whose outcome outlives the next refresh.

Needs /usr/bin/chromium (see tests/browser_util.py); skipped locally without it, a failure with
``CI=true``. Leaves test-artifacts/live-dashboard.png always, page HTML and log on failure.
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
import time
from pathlib import Path
from typing import Any

import pytest
import zenoh
from browser_util import (  # noqa: F401 - browser is a fixture
    REPO,
    VoilaServer,
    _port_open,
    browser,
    new_context,
    open_page,
    save_artifacts,
    screenshot,
)
from zenoh_util import free_port, router_configs, unique_prefix

from istos import Istos, JobContext


class Owner:
    """A router session and an owner (client mode) served on a background loop."""

    def __init__(self) -> None:
        router, self.clients = router_configs(3)
        self.router = zenoh.open(zenoh.Config.from_json5(json.dumps(router)))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.prefix = unique_prefix()
        self.app = Istos(zenoh=self.clients[0], prefix=self.prefix, node_id="owner")
        self.app.queue("mail", max_attempts=1, admin=True)

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(20)

    def close(self) -> None:
        self.run(self.app.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.router.close()


def served_url(log_path: Path, port: int, timeout_s: float = 60.0) -> str:
    """The URL ``istos dashboard`` printed (its token included), read from its log."""
    for _ in range(int(timeout_s / 0.1)):
        for line in log_path.read_text(errors="replace").splitlines():
            if line.startswith("serving the dashboard of ") and f":{port}/" in line:
                return line.rsplit(" on ", 1)[1].strip()
        threading.Event().wait(0.1)
    raise AssertionError(f"no URL printed: {log_path.read_text(errors='replace')[-2000:]}")


def _seconds_apart(a: str, b: str) -> int:
    """How far apart two ``HH:MM:SS`` clock readings are (across midnight too)."""
    return abs(_seconds_after(a, b))


def _seconds_after(a: str, b: str) -> int:
    """How many seconds ``HH:MM:SS`` reading ``b`` is after ``a`` (negative: before; the
    nearer way round midnight)."""
    def seconds(t: str) -> int:
        h, m, s = map(int, t.split(":"))
        return h * 3600 + m * 60 + s

    d = (seconds(b) - seconds(a)) % 86400
    return d - 86400 if d > 43200 else d


def _column(page: Any, name: str) -> list[str]:
    """The Jobs tab's column ``name``, as the page shows it."""
    return page.evaluate("""name => {
        const t = document.querySelector('.istos-table-jobs table');
        const i = [...t.querySelectorAll('th')].map(h => h.textContent).indexOf(name);
        return [...t.querySelectorAll('tbody tr')].map(r => r.children[i].textContent);
    }""", name)


async def _fail(job: dict, ctx: JobContext) -> None:
    raise RuntimeError("mailbox full")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_istos_dashboard_job_detail_and_confirmed_admin_in_chromium(browser, tmp_path):  # noqa: F811
    owner = Owner()
    worker = Istos(zenoh=owner.clients[1], prefix=owner.prefix, node_id="wk")
    worker.worker("mail", concurrency=1, poll_interval_s=0.1)(_fail)
    proc = None
    try:
        owner.run(owner.app.start())
        died = threading.Event()
        owner.app.events.subscribe(lambda e: died.set() if e.kind == "dead_lettered" else None)
        dead_id = owner.run(owner.app.enqueue("mail", {"to": "full@x"}))
        owner.run(worker.start())
        assert died.wait(20), "the failing job was not dead-lettered"
        owner.run(worker.stop())
        state = owner.app.owners["mail"].state
        ids = [owner.run(owner.app.enqueue("mail", {"to": f"u{i}@x"})) for i in range(3)]
        # A backlog past the Jobs tab's 200 rows a page (1 dead + 3 + 250 ready: 254).
        owner.run(owner.app.enqueue_many("mail", [{"to": f"b{i}@x"} for i in range(250)]))

        port = free_port()
        log_path = tmp_path / "dashboard.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "istos", "dashboard", "mail", "--port", str(port),
                 "--zenoh", json.dumps(owner.clients[2]), "--prefix", owner.prefix],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        server = VoilaServer(served_url(log_path, port), log_path, proc)  # type: ignore[arg-type]
        for _ in range(600):  # bounded: 60 s for Voila to listen
            if _port_open(port) or proc.poll() is not None:
                break
            threading.Event().wait(0.1)
        assert _port_open(port), server.log()

        context = new_context(browser)
        page = context.new_page()
        try:
            opened = time.strftime("%H:%M:%S", time.gmtime())
            open_page(page, server.url, ".istos-status", "refreshed", timeout_s=60.0)
            assert "queue mail on owner" in page.locator(".istos-stats").inner_text()
            # The time charts' span ends at a full refresh's instant, on the status's clock:
            # at the status's own refresh (or the one after: the two lines arrive as separate
            # messages). A timer tick that found nothing new updates only the status and
            # leaves the charts as drawn, so then the span ends at or before the status, and
            # after the page opened (on a loaded machine several ticks can pass meanwhile).
            clocks = page.evaluate("""() => [".istos-chart-window", ".istos-status"].map(
                s => document.querySelector(s).textContent)""")
            chart_end, status_at = (re.findall(r"\d\d:\d\d:\d\d", text)[-1] for text in clocks)
            assert "UTC (now)" in clocks[0], clocks
            if "nothing new" in clocks[1]:
                assert _seconds_after(chart_end, status_at) >= -1, (clocks, opened)
                assert _seconds_after(opened, chart_end) >= -1, (clocks, opened)
            else:
                assert _seconds_apart(chart_end, status_at) <= 4, clocks
            page.get_by_role("tab", name="jobs", exact=True).click()
            jobs = page.locator(".istos-table-jobs")
            jobs.locator("text=1–200 of 254 jobs").wait_for(timeout=20_000)
            page.locator("button.istos-jobs-next").click()  # the backlog's second page
            jobs.locator("text=201–254 of 254 jobs").wait_for(timeout=20_000)
            assert page.locator("button.istos-jobs-next").is_disabled()
            page.locator(".istos-jobs-state select").select_option("dead")  # back to page 1
            jobs.locator("text=1–1 of 1 jobs").wait_for(timeout=20_000)
            assert _column(page, "ready / lease ends") == ["–"]  # a dead job: no "min"

            # The depth tab draws the owner's series when selected (only the shown tab's chart
            # is drawn at a refresh), its caption the owner's exact counts: the backlog's.
            page.get_by_role("tab", name="depth", exact=True).click()
            counts = state.counts
            caption = page.locator(".istos-depth-caption")
            caption.locator(f"text=ready {counts['ready']}").wait_for(timeout=20_000)
            assert f"dead {counts['dead']}" in caption.inner_text()
            assert "the owner's counts at" in caption.inner_text()
            page.wait_for_function("""() => {
                const img = document.querySelector('.istos-depth-caption')
                    .parentElement.querySelector('img.istos-chart');
                return img && img.naturalWidth > 0 && img.offsetParent !== null; }""",
                                   timeout=20_000)

            page.get_by_role("tab", name="job", exact=True).click()
            page.locator(".istos-job-id input").fill(dead_id)
            page.locator("button.istos-job-show").click()
            detail = page.locator(".istos-job-detail")
            detail.locator("text=mailbox full").first.wait_for(timeout=20_000)
            assert "1 attempt(s)" in detail.inner_text()

            admin = page.locator(".istos-admin")
            admin.wait_for(state="visible", timeout=20_000)
            page.locator("button.istos-admin-pause").click()
            # The confirmation sits right under the admin row, its buttons unmistakable.
            confirm = page.locator(".istos-admin + .istos-confirm")
            confirm.wait_for(state="visible", timeout=20_000)
            assert "Pause claiming" in confirm.inner_text()
            no = page.locator("button.istos-confirm-no")
            assert no.inner_text().strip() == "No, keep"
            assert page.locator("button.istos-confirm-yes").inner_text().strip() == "Yes, pause"
            no.click()
            confirm.wait_for(state="hidden", timeout=20_000)
            assert state.paused is False  # kept: nothing was sent
            message = page.locator(".istos-message")
            message.locator("text=kept: nothing sent").wait_for(timeout=20_000)

            # A dead letter's own Resubmit button, through the same confirmation.
            page.get_by_role("tab", name="dead letters", exact=True).click()
            row = page.locator(".istos-dead-row", has_text=dead_id)
            row.locator("button.istos-dead-resubmit").click()
            confirm.wait_for(state="visible", timeout=20_000)
            assert dead_id in confirm.inner_text()
            assert state.jobs[dead_id].state == "dead"  # nothing sent before "Yes"
            page.locator("button.istos-confirm-yes", has_text="Yes, resubmit").click()
            message.locator("text=done: Resubmit").wait_for(timeout=20_000)
            new_id = re.search(r"→ (\S+)", message.inner_text()).group(1)  # type: ignore[union-attr]
            assert state.jobs[new_id].state == "ready" and new_id not in ids
            # The outcome outlives the next refreshes (the status line moves on).
            status = page.locator(".istos-status").inner_text()
            page.wait_for_function("s => document.querySelector('.istos-status').textContent"
                                   " !== s", arg=status, timeout=20_000)
            assert "done: Resubmit" in message.inner_text() and new_id in message.inner_text()
        except BaseException:
            save_artifacts("live-dashboard", page, server)
            raise
        finally:
            screenshot(page, "live-dashboard")
            context.close()
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        owner.close()


def test_dashboard_without_a_mesh_exits_3_before_starting_voila(tmp_path):
    _, clients = router_configs(1)  # nothing listens on the router's port
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-m", "istos", "dashboard", "nobody", "--zenoh",
                          json.dumps(clients[0]), "--prefix", unique_prefix(), "--timeout",
                          "0.5"], capture_output=True, text=True, timeout=60, env=env,
                         cwd=Path(tmp_path))
    assert out.returncode == 3 and "cannot reach the Zenoh mesh" in out.stderr
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
