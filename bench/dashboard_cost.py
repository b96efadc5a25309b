"""Perf check (not a test): what one open, idle ``istos dashboard`` page costs, and how long
the server takes to stop on SIGTERM (issue 25: "an open idle page costs <= 3% of a core;
SIGTERM stops within 1 s").

Run: ``.venv/bin/python bench/dashboard_cost.py [--window 30] [--pages 1] [--stops 3]``.
An owner serves ``mail`` (50 ready jobs, nothing moving) on a private loopback Zenoh mesh in
this process; ``istos dashboard mail`` runs as a subprocess at its default 2 s refresh and
headless Chromium (/usr/bin/chromium, never a downloaded browser) opens the page. After the
first refresh and a settling pause, the CPU (utime + stime from /proc) of Voila and of its
kernel processes is summed over ``--window`` seconds and printed as % of one core, with the
kernel's share apart. Then SIGTERM, and the seconds until the ``istos dashboard`` process has
exited (and whether a kernel outlived it); ``--stops`` repeats the start/open/stop cycle.
Asserts nothing; the figures depend on the machine's load (printed).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._common import free_port, unique_prefix, zenoh_configs  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None and int(st[1]) == pid:
                out.append(int(entry))
    return out


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` in seconds (0 once it is gone)."""
    st = _stat(pid)
    return 0.0 if st is None else (int(st[11]) + int(st[12])) / TICKS


def wait_for(pred: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise SystemExit(f"not in {timeout_s:g} s: {what}")
        threading.Event().wait(0.05)


def served_url(log: Path, timeout_s: float = 60.0) -> str:
    found: list[str] = []

    def printed() -> bool:
        found[:] = [line.rsplit(" on ", 1)[1].strip() for line in
                    log.read_text(errors="replace").splitlines() if line.startswith("serving ")]
        return bool(found)

    wait_for(printed, timeout_s, "the dashboard printed its URL")
    return found[0]


def one_cycle(browser: Any, cfg: dict[str, Any], prefix: str, window_s: float, pages: int,
              work: Path) -> tuple[float | None, float, bool]:
    """Start ``istos dashboard``, open ``pages`` pages, measure (when ``window_s``), SIGTERM.
    Returns (% of a core idle or None, seconds to stop, whether a kernel was left)."""
    import socket

    port, log_path = free_port(), work / f"dashboard-{time.monotonic_ns()}.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(ROOT), os.environ.get("PYTHONPATH")]))}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "istos", "dashboard", "mail", "--port",
                                 str(port), "--zenoh", json.dumps(cfg), "--prefix", prefix],
                                stdout=log, stderr=subprocess.STDOUT, env=env)

    def listening() -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        url = served_url(log_path)
        wait_for(listening, 60, "Voila listens")
        voila = next(p for p in children(proc.pid) if "voila" in _cmdline(p))
        context = browser.new_context(viewport={"width": 1400, "height": 1100})
        context.route("**/*", lambda r: r.continue_() if "127.0.0.1" in r.request.url
                      else r.abort())
        for _ in range(pages):
            page = context.new_page()
            page.goto(url, wait_until="commit", timeout=90_000)
            page.locator(".istos-status", has_text="refreshed").first.wait_for(timeout=90_000)
        kernels = [p for p in children(voila) if "ipykernel_launcher" in _cmdline(p)]
        share = None
        if window_s:
            threading.Event().wait(4.0)  # the first refreshes draw every chart: not idle yet
            status = page.locator(".istos-status").first
            first = status.inner_text()
            procs = [voila, *kernels]
            before, t0 = [cpu_s(p) for p in procs], time.monotonic()
            threading.Event().wait(window_s)
            after, t1 = [cpu_s(p) for p in procs], time.monotonic()
            used = [b - a for a, b in zip(before, after)]
            share = 100 * sum(used) / (t1 - t0)
            print(f"{pages} open idle page(s): {share:.1f} % of a core over {t1 - t0:.0f} s "
                  f"(voila {100 * used[0] / (t1 - t0):.1f} %, kernel(s) "
                  f"{100 * sum(used[1:]) / (t1 - t0):.1f} %); the page said {first!r}, "
                  f"then {status.inner_text()!r}", flush=True)
        proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        proc.wait(30)
        took = time.monotonic() - started
        left = any(_stat(k) is not None for k in kernels)
        print(f"stopped {took:.2f} s after SIGTERM (exit {proc.returncode}); "
              f"kernel left: {left}", flush=True)
        context.close()
        return share, took, left
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--pages", type=int, default=1)
    parser.add_argument("--stops", type=int, default=1)
    args = parser.parse_args()
    import asyncio

    from playwright.sync_api import sync_playwright

    from istos import Istos

    owner_cfg, _ = zenoh_configs(2)
    endpoint = owner_cfg["listen"]["endpoints"][0]
    client = {"mode": "client", "connect": {"endpoints": [endpoint]},
              "scouting": {"multicast": {"enabled": False}, "gossip": {"enabled": False}}}
    prefix = unique_prefix()
    app = Istos(zenoh=owner_cfg, prefix=prefix, node_id="owner")
    app.queue("mail", admin=True)
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(30)

    print(f"load average before: {os.getloadavg()}", flush=True)
    run(app.start())
    try:
        for i in range(50):
            run(app.enqueue("mail", {"to": f"u{i}@x"}))
        with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                         headless=True)
            try:
                stops = [one_cycle(browser, client, prefix, args.window if i == 0 else 0,
                                   args.pages, Path(tmp)) for i in range(args.stops)]
            finally:
                browser.close()
        took = sorted(s[1] for s in stops)
        print(f"SIGTERM to exit over {len(took)} stop(s): min {took[0]:.2f} s, "
              f"max {took[-1]:.2f} s; kernels left: {sum(s[2] for s in stops)}")
    finally:
        run(app.stop())
        print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
