"""Real-browser tests of notebooks: serve one with Voila, drive Debian's Chromium via Playwright.

Facts this follows (verified on the CI machine kind): never ``playwright install`` (browser
downloads fail there) — launch ``/usr/bin/chromium`` from ``apt-get install -y chromium``;
Voila has no readiness endpoint, so wait for its TCP port; every GET of the page starts a
kernel; Voila fetches a font from a CDN, so non-localhost requests are blocked to keep the test
hermetic; the first page load occasionally hangs in the kernel (jupyter/nbclient#312), so pages
are loaded with ``wait_until="commit"`` and reloaded once if the ready marker does not appear.

Use from a test module::

    from browser_util import (browser, print_screenshots, require_browser,  # noqa: F401
                              serve_voila, open_page)

``browser`` is a session-scoped fixture (import it into the module; one Chromium per module
that imports it — a conftest.py would make it one per session).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from services import free_port

REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]
INSTALL_HINT = ("install Debian's Chromium with `apt-get install -y chromium` (as root) and the "
                "dev extras with `pip install -e '.[dev]'`; do not run `playwright install`")


def require_browser() -> None:
    """Skip (locally) or fail (with ``CI=true``) when Chromium or Playwright is missing."""
    missing = []
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        missing.append(CHROMIUM)
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package")
    try:
        import voila  # noqa: F401
    except ImportError:
        missing.append("the voila package")
    if not missing:
        return
    message = f"browser test needs {', '.join(missing)}: {INSTALL_HINT}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class VoilaServer:
    url: str
    log_path: Path
    process: subprocess.Popen[bytes]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.contextmanager
def serve_voila(notebook: Path, workdir: Path, start_timeout_s: float = 60.0
                ) -> Iterator[VoilaServer]:
    """Serve a temporary copy of ``notebook`` (in ``workdir``) with Voila on 127.0.0.1.

    Yields once the port accepts connections; raises RuntimeError with the log if Voila exits
    or does not listen within ``start_timeout_s``. On exit stops Voila and its kernels (its own
    process group: SIGTERM, then SIGKILL after 10 s).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    copy = workdir / notebook.name
    shutil.copy(notebook, copy)  # Voila and kernels may write next to it; keep the repo clean
    port = free_port()
    log_path = workdir / "voila.log"
    env = {**os.environ, "JUPYTER_PLATFORM_DIRS": "1", "MPLBACKEND": "Agg",
           "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                       os.environ.get("PYTHONPATH")]))}
    cmd = [sys.executable, "-m", "voila", copy.name, "--no-browser", f"--port={port}",
           "--Voila.ip=127.0.0.1", "--VoilaConfiguration.show_tracebacks=True"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    server = VoilaServer(f"http://127.0.0.1:{port}/", log_path, proc)
    try:
        deadline = time.monotonic() + start_timeout_s
        while not _port_open(port):
            if proc.poll() is not None:
                raise RuntimeError(f"voila exited with {proc.returncode}:\n{server.log()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"voila did not listen within {start_timeout_s} s:\n"
                                   f"{server.log()}")
            time.sleep(0.1)
        yield server
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    # Voila's kernels are its children, in the process group start_new_session gave it.
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def launch_browser(playwright: Any) -> Any:
    """Debian's Chromium, headless, through Playwright (never a downloaded browser)."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                      headless=True)


def new_context(browser: Any, **options: Any) -> Any:
    """A fresh browser context that lets only 127.0.0.1/localhost requests through (default
    viewport 1400x1100; ``viewport=`` overrides it)."""
    options.setdefault("viewport", {"width": 1400, "height": 1100})
    context = browser.new_context(**options)

    def gate(route: Any) -> None:
        host = urlsplit(route.request.url).hostname
        if host in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            route.abort()

    context.route("**/*", gate)
    return context


def open_page(page: Any, url: str, ready_selector: str, ready_text: str,
              timeout_s: float = 30.0) -> None:
    """Load ``url`` and wait for ``ready_selector`` to show ``ready_text``; reload once (a fresh
    kernel) if it does not within ``timeout_s``. Raises Playwright's TimeoutError after that."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    ready = page.locator(ready_selector, has_text=ready_text).first
    page.goto(url, wait_until="commit", timeout=timeout_s * 1000)
    try:
        ready.wait_for(timeout=timeout_s * 1000)
    except PlaywrightTimeout:
        page.reload(wait_until="commit", timeout=timeout_s * 1000)
        ready.wait_for(timeout=timeout_s * 1000)


def box(page: Any, selector: str) -> dict[str, float]:
    """The first ``selector`` match's bounding box in CSS px (x, y, width, height)."""
    found = page.locator(selector).first.bounding_box()
    assert found is not None, f"{selector} is not rendered"
    return dict(found)


def save_artifacts(name: str, page: Any = None, server: VoilaServer | None = None) -> None:
    """Write ``<name>.html`` (the page) and ``<name>-voila.log`` into test-artifacts/."""
    ARTIFACTS.mkdir(exist_ok=True)
    if page is not None:
        with contextlib.suppress(Exception):  # a crashed page must not hide the real error
            (ARTIFACTS / f"{name}.html").write_text(page.content())
    if server is not None:
        (ARTIFACTS / f"{name}-voila.log").write_text(server.log())


def screenshot(page: Any, name: str) -> Path:
    """A full-page screenshot at test-artifacts/<name>.png (best effort, never raises).

    test-artifacts/ is ignored by git; CI keeps it as the run's artifacts. Tests that import
    the ``print_screenshots`` fixture print each saved path to the terminal.
    """
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    with contextlib.suppress(Exception):
        page.screenshot(path=str(path), full_page=True, timeout=15_000)
        SAVED.append(path)
    return path


SAVED: list[Path] = []  # screenshots written during the current test


@pytest.fixture(autouse=True)
def print_screenshots(capsys: pytest.CaptureFixture[str]) -> Iterator[None]:
    """After each test of a module that imports this fixture, print the screenshots it saved
    to the terminal (past pytest's output capture), so a CI log says where they are."""
    SAVED.clear()
    yield
    if SAVED:
        with capsys.disabled():
            for path in SAVED:
                print(f"\nscreenshot saved: {path}")
    SAVED.clear()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per test module (contexts are per test); module scope so that the
    sync Playwright loop is gone before later asyncio tests run."""
    require_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = launch_browser(playwright)
        try:
            yield chromium
        finally:
            chromium.close()
