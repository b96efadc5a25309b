"""``istos dashboard``: the LiveDashboard of one queue as a web page, served by Voila on
127.0.0.1 (a Flower-like page without writing a notebook).

Writes a one-cell notebook into a temporary directory (attach, build the dashboard, show it)
with a kernelspec pointing at this interpreter, and runs ``python -m voila`` on it until SIGINT
or SIGTERM. Every page load starts a kernel that attaches read-only; admin buttons appear only
if the owner reports ``admin=True``. Needs voila and the notebook side (``istos_nb``) installed.

What a page costs: the page's own timer drives its refreshes, so a closed page's kernel goes
quiet and Voila's culler ends it after ``--cull-after`` seconds idle (default 60, checked every
:data:`CULL_INTERVAL_S`); an open page is never culled. The page wants a token (printed in the
URL, as Jupyter does; ``--no-token`` to serve without one); it binds 127.0.0.1 unless ``--host``
says otherwise (with a warning: anyone who reaches it with the token can act on admin queues).
A config file path given to ``--zenoh`` is made absolute first (the kernel runs in the
temporary directory). SIGTERM/SIGINT stop Voila and its kernels at once (the CLI exits
about 0.5 s after the signal).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import ConfigError

CULL_AFTER_S = 60.0
CULL_INTERVAL_S = 10.0
# Kernels are killed at once; Voila gets SIGTERM, then this long, then SIGKILL for its group
# (it never finished its own shutdown within 0.5 s here): the CLI exits in ~0.5 s.
STOP_GRACE_S = 0.2


def notebook(queue: str | None, zenoh: str | None, prefix: str, timeout_s: float
             ) -> dict[str, Any]:
    """The notebook Voila serves (nbformat 4 as a dict): the queue's dashboard, or with no
    queue the overview of every queue; ``?queue=`` and ``?job=`` in the URL pick a queue and
    open a job (Voila hands the kernel the page's query string as ``QUERY_STRING``)."""
    source = ("import os\n"
              "from istos_nb.views.dashboard_page import page\n"
              f"page({queue!r}, {zenoh!r}, {prefix!r}, {timeout_s!r}, "
              "os.environ.get('QUERY_STRING', ''))")
    cell: dict[str, Any] = {"cell_type": "code", "metadata": {}, "execution_count": None,
                            "outputs": [], "source": source}
    return {"nbformat": 4, "nbformat_minor": 5, "cells": [cell],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                        "language": "python"}}}


def _prepare(workdir: Path, args: argparse.Namespace) -> Path:
    spec = workdir / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3", "language": "python"}))
    name = "istos-" + ("-".join(filter(None, args.queue.split("/"))) if args.queue
                       else "overview") + ".ipynb"
    path = workdir / name
    path.write_text(json.dumps(notebook(args.queue, absolute_config(args.zenoh), args.prefix,
                                        args.timeout)))
    return path


def absolute_config(zenoh: str | None) -> str | None:
    """``--zenoh`` as the kernel must see it: a file path made absolute (the kernel runs in
    another directory), inline JSON5 as given."""
    if zenoh and not zenoh.lstrip().startswith("{") and Path(zenoh).expanduser().is_file():
        return str(Path(zenoh).expanduser().resolve())
    return zenoh


def voila_args(args: argparse.Namespace, notebook_name: str, token: str | None) -> list[str]:
    """Voila's command line: the port and host, the token, and the culler."""
    cull = float(getattr(args, "cull_after", None) or CULL_AFTER_S)
    return [sys.executable, "-m", "voila", notebook_name, "--no-browser", f"--port={args.port}",
            f"--Voila.ip={args.host}", f"--token={token or ''}",
            f"--MappingKernelManager.cull_idle_timeout={cull:g}",
            f"--MappingKernelManager.cull_interval={min(CULL_INTERVAL_S, cull):g}",
            "--MappingKernelManager.cull_connected=False"]


async def serve_dashboard(args: argparse.Namespace, out: Any) -> int:
    """Run Voila until SIGINT/SIGTERM (or until it exits); returns its exit status."""
    # Only looked up, never imported: Voila runs as its own process, and importing it here
    # (Jupyter Server, jupyter_events...) took seconds at start and ~0.8 s at exit.
    if importlib.util.find_spec("voila") is None:
        raise ConfigError("istos dashboard needs voila: pip install voila")
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port must be 1..65535, got {args.port}")
    if args.cull_after is not None and not 1 <= args.cull_after <= 86_400:
        raise ConfigError(f"--cull-after must be 1..86400 seconds, got {args.cull_after}")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        sys.stderr.write(f"istos: warning: serving the dashboard on {args.host}, not only this "
                         "machine: whoever reaches it"
                         + (" with the token" if not args.no_token else "")
                         + " can see the queue (and act on it if it is admin=True)\n")
    token = None if args.no_token else secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="istos-dashboard-") as tmp:
        work = Path(tmp)
        nb = _prepare(work, args)
        env = {**os.environ, "JUPYTER_PATH": str(work / "jupyter"), "JUPYTER_PLATFORM_DIRS": "1",
               "JUPYTER_RUNTIME_DIR": str(work / "runtime"), "MPLBACKEND": "Agg"}
        proc = subprocess.Popen(voila_args(args, nb.name, token), cwd=work, env=env,
                                start_new_session=True)
        what = f"the dashboard of {args.queue}" if args.queue else "the overview of every queue"
        host = f"[{args.host}]" if ":" in args.host else args.host
        url = f"http://{host}:{args.port}/" + (f"?token={token}" if token else "")
        out.write(f"serving {what} on {url}\n")
        out.flush()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            waiting = loop.create_task(asyncio.to_thread(proc.wait))
            stopping = loop.create_task(stop.wait())
            await asyncio.wait([waiting, stopping], return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            _stop_group(proc)
    if stop.is_set():  # we were told to stop, and stopped it (maybe with SIGKILL): success
        return 0
    return 0 if proc.returncode in (0, -signal.SIGTERM, None) else int(proc.returncode)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    # Voila's own shutdown takes seconds (it asks each kernel to stop, one by one, and waits);
    # the page's state is only the kernels' own, so they are killed at once, Voila gets
    # STOP_GRACE_S to exit on SIGTERM, then its whole group is killed. jupyter_client gives
    # each kernel a session of its own: they are found as Voila's children.
    kernels: set[int] = set()
    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        started = _children(proc.pid) - kernels  # (a page may have started one meanwhile)
        _kill(started, signal.SIGKILL)
        kernels |= started
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait_s)


def _kill(pids: set[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (Linux ``/proc``; empty elsewhere)."""
    out = set()
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    out.add(int(entry))
    return out
