"""``istos dashboard`` without a queue in a real browser (issue 26): the overview lists every
queue and its row opens that queue's dashboard; ``?job=ID`` opens a job's detail with its
traceback; the Workers and Latency tabs show the owner's numbers; a bulk admin button goes
through its confirmation; a chain step's detail shows the workflow's row of steps and the
step's kept result. Against a live owner behind a Zenoh router, in headless Chromium.

Leaves test-artifacts/ops-overview.png and ops-dashboard.png always, page HTML and log on
failure (see tests/browser_util.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest
from browser_util import (  # noqa: F401 - browser and print_screenshots are fixtures
    REPO,
    VoilaServer,
    _port_open,
    browser,
    new_context,
    open_page,
    print_screenshots,
    save_artifacts,
    screenshot,
)
from test_browser_live import Owner, _fail
from zenoh_util import free_port

from istos import Istos


async def _step(job: dict) -> dict:
    return {"sent_to": job["to"]}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_overview_job_link_workers_latency_and_a_bulk_action_in_chromium(browser, tmp_path):  # noqa: F811
    owner = Owner()
    owner.app.queue("other")
    owner.app.queue("flow", keep_results=True)  # a chain's first step, its result kept
    worker = Istos(zenoh=owner.clients[1], prefix=owner.prefix, node_id="wk")
    worker.worker("mail", concurrency=1, poll_interval_s=0.1)(_fail)
    worker.worker("flow", concurrency=1, poll_interval_s=0.1)(_step)
    proc = None
    try:
        owner.run(owner.app.start())
        died, stepped = threading.Event(), threading.Event()
        owner.app.events.subscribe(lambda e: died.set() if e.kind == "dead_lettered" else None)
        owner.app.events.subscribe(
            lambda e: stepped.set() if e.kind == "acked" and e.queue == "flow" else None)
        dead_id = owner.run(owner.app.enqueue("mail", {"to": "full@x"}))
        first = owner.run(owner.app.chain(["flow", "other"], {"to": "chain@x"}))
        chain_id = first.rpartition(".")[0]
        owner.run(worker.start())
        assert died.wait(30), "the failing job was not dead-lettered"
        assert stepped.wait(30), "the chain's first step was not acked"
        state = owner.app.owners["mail"].state
        later = owner.run(owner.app.enqueue("mail", {"to": "later@x"}, delay_s=3600))

        port = free_port()
        log_path = tmp_path / "dashboard.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "istos", "dashboard", "--port", str(port),
                 "--zenoh", json.dumps(owner.clients[2]), "--prefix", owner.prefix,
                 "--timeout", "20", "--no-token"],  # (the page's own links carry no token)
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        server = VoilaServer(f"http://127.0.0.1:{port}/", log_path, proc)  # type: ignore[arg-type]
        for _ in range(900):  # bounded: 90 s for Voila to listen
            if _port_open(port) or proc.poll() is not None:
                break
            threading.Event().wait(0.1)
        assert _port_open(port), server.log()

        context = new_context(browser)
        page = context.new_page()
        try:
            open_page(page, server.url, ".istos-overview-page", "3 queue(s)", timeout_s=90.0)
            overview = page.locator(".istos-overview-page")
            assert "mail" in overview.inner_text() and "other" in overview.inner_text()
            href = overview.get_by_role("link", name="mail", exact=True).get_attribute("href")
            assert href == "?queue=mail"
            screenshot(page, "ops-overview")

            open_page(page, f"{server.url}?queue=mail&job={dead_id}", ".istos-job-detail",
                      "traceback of the last failed attempt", timeout_s=90.0)
            detail = page.locator(".istos-job-detail")
            tb = detail.locator(".istos-traceback").inner_text()
            assert "Traceback (most recent call last)" in tb
            assert "RuntimeError: mailbox full" in tb and "in _fail" in tb

            page.get_by_role("tab", name="workers", exact=True).click()
            workers = page.locator(".istos-workers")
            workers.locator("text=wk:_fail").first.wait_for(timeout=30_000)
            page.get_by_role("tab", name="latency", exact=True).click()
            page.locator(".istos-latency", has_text="since the owner started").first.wait_for(
                timeout=30_000)

            page.locator("button.istos-admin-promote").click()
            confirm = page.locator(".istos-confirm")
            confirm.wait_for(state="visible", timeout=30_000)
            assert "every delayed job" in confirm.inner_text()
            page.locator("button.istos-confirm-yes").click()
            page.locator(".istos-message", has_text="done: Make every delayed").wait_for(
                timeout=30_000)
            assert state.jobs[later].state in ("ready", "leased", "dead")
            screenshot(page, "ops-dashboard")

            # A chain step's detail: the workflow as a row of steps (queue, id, state), this
            # step marked, and the result its queue kept.
            open_page(page, f"{server.url}?queue=flow&job={first}", ".istos-job-detail",
                      f"workflow: chain {chain_id}", timeout_s=90.0)
            detail = page.locator(".istos-job-detail")
            steps = detail.locator(".istos-workflow .istos-step")
            assert steps.count() == 2
            done, waiting = (steps.nth(i).inner_text() for i in range(2))
            assert "flow" in done and f"{chain_id}.0" in done and "done" in done, done
            assert "other" in waiting and f"{chain_id}.1" in waiting and "ready" in waiting, \
                waiting
            assert detail.locator(".istos-step-here").inner_text() == done
            assert '"sent_to": "chain@x"' in detail.locator(".istos-result").inner_text()
            screenshot(page, "ops-workflow")
        except BaseException:
            save_artifacts("ops-dashboard", page, server)
            raise
        finally:
            context.close()
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        owner.run(worker.stop())
        owner.close()
