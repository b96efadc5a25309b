"""The simulator dashboard in a real browser: Voila serves notebooks/dashboard.ipynb, headless
Chromium moves a slider, presses Run and reads the charts and tables the kernel sent back.

Needs /usr/bin/chromium (``apt-get install -y chromium``); skipped locally without it, a failure
with ``CI=true``. Leaves screenshots in test-artifacts/ (ignored by git, kept by CI, each path
printed): dashboard.png (the leases chart), dashboard-jobs.png, dashboard-invariants.png and
teaching-notebook.png; the page HTML and Voila log too when a test fails.
"""

from __future__ import annotations

import re

import pytest
from browser_util import (  # noqa: F401 - browser is a fixture
    REPO,
    box,
    browser,
    new_context,
    open_page,
    print_screenshots,
    save_artifacts,
    screenshot,
    serve_voila,
)

NOTEBOOK = REPO / "notebooks" / "dashboard.ipynb"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_dashboard_runs_a_simulation_from_the_browser(browser, tmp_path):  # noqa: F811
    with serve_voila(NOTEBOOK, tmp_path / "voila") as server:
        # 1440x900: the laptop screen the issue was read on (a projector is no bigger)
        context = new_context(browser, viewport={"width": 1440, "height": 900})
        page = context.new_page()
        try:
            # The status is set by Python when the dashboard is built: the kernel is live.
            open_page(page, server.url, ".istos-status", "ready")
            # Every slider's track is long enough to aim at (the jobs slider's 100 steps had
            # ~50 px), and the run horizon is one of the controls.
            tracks = page.locator(".widget-slider .noUi-target")
            assert tracks.count() >= 14
            widths = [tracks.nth(i).bounding_box()["width"] for i in range(tracks.count())]
            assert min(widths) >= 200, widths
            assert box(page, ".istos-param-horizon_s .noUi-target")["width"] >= 200
            # Before Run, the open tab says what to do instead of showing an empty box.
            hint = page.locator(".istos-hint", has_text="press Run").first
            hint.wait_for(state="visible", timeout=20_000)

            # One ArrowLeft on the jobs slider is one step (200 -> 190). Python echoes the new
            # scenario into .istos-scenario, which proves the change reached the kernel before
            # Run reads the controls.
            page.locator(".istos-param-jobs .noUi-handle").focus()
            page.keyboard.press("ArrowLeft")
            page.locator(".istos-scenario", has_text="190 jobs").wait_for(timeout=20_000)

            page.locator("button.istos-run").click()
            status = page.locator(".istos-status", has_text="run finished:")
            status.wait_for(timeout=90_000)
            held = re.search(r"run finished: 190 jobs enqueued, (\d+)/(\d+) invariants hold",
                             status.inner_text())
            assert held and held[1] == held[2]
            assert page.locator(".istos-progress").count() == 1

            chart = page.locator("img.istos-chart").first  # the leases tab is open
            chart.wait_for(state="visible", timeout=20_000)
            src = chart.get_attribute("src") or ""
            assert src.startswith(("blob:", "data:")), src
            # decoded by the browser, at the size the kernel drew it
            page.wait_for_function("img => img.complete && img.naturalWidth > 300",
                                   arg=chart.element_handle(), timeout=20_000)

            page.get_by_role("tab", name="jobs", exact=True).click()
            rows = page.locator(".istos-table-jobs table tbody tr")
            rows.first.wait_for(state="visible", timeout=20_000)
            assert rows.count() == 190
            assert "190 jobs" in page.locator(".istos-table-jobs").inner_text()
            # Dead and unfinished jobs come first, and the page says how many of each.
            assert "done," in page.locator(".istos-table-jobs").inner_text()
            # The wide jobs table scrolls inside its pane: nothing runs past the page edge.
            scroll = box(page, ".istos-table-jobs .istos-scroll")
            assert scroll["x"] >= 0 and scroll["x"] + scroll["width"] <= 1440, scroll
            sizes = page.locator(".istos-table-jobs .istos-scroll").first.evaluate(
                "el => [el.scrollWidth, el.clientWidth, getComputedStyle(el).overflowX]")
            assert sizes[2] == "auto", sizes
            last_header = box(page, ".istos-table-jobs th:last-child")
            assert last_header["width"] > 0
            page_width = page.evaluate("() => document.documentElement.scrollWidth")
            assert page_width <= 1440, page_width  # no horizontal page scroll
            screenshot(page, "dashboard-jobs")

            page.get_by_role("tab", name="invariants", exact=True).click()
            legend = page.locator(".istos-table-invariants .istos-legend")
            legend.wait_for(state="visible", timeout=20_000)
            words = legend.inner_text()
            for word in ("ok", "lost", "duplicated", "pending"):
                assert word in words, words
            screenshot(page, "dashboard-invariants")
            page.get_by_role("tab", name="leases", exact=True).click()  # for the screenshot
            chart.wait_for(state="visible", timeout=20_000)
        except BaseException:
            save_artifacts("dashboard", page, server)
            raise
        finally:
            screenshot(page, "dashboard")
            context.close()


TEACHING = REPO / "notebooks" / "04-backoff-and-jitter.ipynb"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_teaching_notebook_renders_its_charts_through_voila(browser, tmp_path):  # noqa: F811
    """A tutorial as a reader would open it as an app: every cell runs in the kernel, and the
    figures it draws (matplotlib PNGs) reach the page."""
    with serve_voila(TEACHING, tmp_path / "voila") as server:
        context = new_context(browser)
        page = context.new_page()
        try:
            open_page(page, server.url, "h1", "Backoff and jitter", timeout_s=60.0)
            figures = page.locator(".jp-OutputArea-output img")
            figures.first.wait_for(state="visible", timeout=90_000)
            page.wait_for_function(
                "() => [...document.querySelectorAll('.jp-OutputArea-output img')]"
                ".filter(i => i.complete && i.naturalWidth > 300).length >= 2",
                timeout=90_000)
            assert "Traceback" not in page.inner_text("body")
        except BaseException:
            save_artifacts("teaching-notebook", page, server)
            raise
        finally:
            screenshot(page, "teaching-notebook")
            context.close()
