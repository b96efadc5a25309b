"""``istos dashboard``: the LiveDashboard of one queue as a web page, served by Voila on
127.0.0.1 (a Flower-like page without writing a notebook).

Writes a three-cell notebook into a temporary directory (attach, build the dashboard, show it)
with a kernelspec pointing at this interpreter, and runs ``python -m voila`` on it until SIGINT
or SIGTERM. Every page load starts a kernel that attaches read-only; admin buttons appear only
if the owner reports ``admin=True``. Needs voila and the notebook side (``istos_nb``) installed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from ..errors import ConfigError


def notebook(queue: str | None, zenoh: str | None, prefix: str, timeout_s: float
             ) -> dict[str, Any]:
    """The notebook Voila serves (nbformat 4 as a dict): the queue's dashboard, or with no
    queue the overview of every queue; ``?queue=`` and ``?job=`` in the URL pick a queue and
    open a job (Voila hands the kernel the page's query string as ``QUERY_STRING``)."""
    source = ("import os\n"
              "from istos_nb.views.opviews import page\n"
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
    path.write_text(json.dumps(notebook(args.queue, args.zenoh, args.prefix, args.timeout)))
    return path


async def serve_dashboard(args: argparse.Namespace, out: Any) -> int:
    """Run Voila until SIGINT/SIGTERM (or until it exits); returns its exit status."""
    try:
        import voila  # noqa: F401 - only checked: Voila runs as its own process
    except ImportError as exc:
        raise ConfigError("istos dashboard needs voila: pip install voila") from exc
    if not 0 < args.port < 65536:
        raise ConfigError(f"--port must be 1..65535, got {args.port}")
    with tempfile.TemporaryDirectory(prefix="istos-dashboard-") as tmp:
        work = Path(tmp)
        nb = _prepare(work, args)
        env = {**os.environ, "JUPYTER_PATH": str(work / "jupyter"), "JUPYTER_PLATFORM_DIRS": "1",
               "JUPYTER_RUNTIME_DIR": str(work / "runtime"), "MPLBACKEND": "Agg"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "voila", nb.name, "--no-browser", f"--port={args.port}",
             "--Voila.ip=127.0.0.1"], cwd=work, env=env, start_new_session=True)
        what = f"the dashboard of {args.queue}" if args.queue else "the overview of every queue"
        out.write(f"serving {what} on http://127.0.0.1:{args.port}/\n")
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
    return 0 if proc.returncode in (0, -signal.SIGTERM, None) else int(proc.returncode)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    # Voila's kernels are its children, in the session start_new_session gave it.
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait_s)
