"""Start JupyterLab on notebook 01 for ``make lab``, printing the notebook's own address.

    python tools/lab.py [--port N] [--dry-run] [extra jupyter lab arguments...]

Before starting it writes JupyterLab's settings overrides into this interpreter's prefix (the
venv: ``<prefix>/share/jupyter/lab/settings/overrides.json``) so the "news" pop-up, which
covered the lower right of every chart, and the update check stay off; other overrides in
that file are kept. It then picks the port and a random token itself (the token travels in the
environment, not on the command line) so it can print the URL that opens
``notebooks/01-quickstart.ipynb`` directly: with ``--no-browser`` JupyterLab alone prints only
``/lab``. ``--dry-run`` writes the settings and prints the URL and command, and starts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = "notebooks/01-quickstart.ipynb"
NEWS_OFF: dict[str, Any] = {"@jupyterlab/apputils-extension:notification": {
    "fetchNews": "false", "checkForUpdates": False}}


def write_overrides(prefix: Path) -> Path:
    """Merge :data:`NEWS_OFF` into ``prefix``'s JupyterLab settings overrides; the path."""
    path = prefix / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    current: dict[str, Any] = {}
    if path.exists():
        try:
            current = json.loads(path.read_text(encoding="utf-8") or "{}")
        except json.JSONDecodeError as exc:
            raise SystemExit(f"{path} is not JSON ({exc}); fix or remove it") from None
    for plugin, settings in NEWS_OFF.items():
        current[plugin] = {**current.get(plugin, {}), **settings}
    path.write_text(json.dumps(current, indent=2) + "\n", encoding="utf-8")
    return path


def free_port(preferred: int = 8888) -> int:
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(s.getsockname()[1])
    raise SystemExit("no free local port")


def notebook_url(port: int, token: str) -> str:
    return f"http://127.0.0.1:{port}/lab/tree/{NOTEBOOK}?token={token}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0, help="port (default: 8888 if free)")
    parser.add_argument("--prefix", type=Path, default=Path(sys.prefix),
                        help="where the settings go (default: this interpreter's venv)")
    parser.add_argument("--dry-run", action="store_true", help="print, start nothing")
    parser.add_argument("--app-settings-dir", type=Path, default=None, help=argparse.SUPPRESS)
    args, extra = parser.parse_known_args(argv)
    settings = write_overrides(args.prefix)
    if args.app_settings_dir is not None:  # tests: read the overrides from elsewhere
        extra.append(f"--LabApp.app_settings_dir={settings.parent}")
    port = args.port or free_port()
    token = secrets.token_hex(16)
    command = [sys.executable, "-m", "jupyterlab", f"--ServerApp.port={port}",
               "--ServerApp.ip=127.0.0.1", "--ServerApp.port_retries=0", *extra, NOTEBOOK]
    if hasattr(os, "getuid") and os.getuid() == 0:
        command.append("--allow-root")  # containers run as root; Lab refuses unless told
    print(f"JupyterLab news pop-up off ({settings})")
    print(f"Open notebook 01 at: {notebook_url(port, token)}", flush=True)
    if args.dry_run:
        print("would run: " + " ".join(command))
        return 0
    os.chdir(ROOT)
    os.execve(sys.executable, command, {**os.environ, "JUPYTER_TOKEN": token})
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
