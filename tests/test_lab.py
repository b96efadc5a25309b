"""`make lab` (tools/lab.py): the news pop-up is off in the settings, and the URL it prints
opens notebook 01 on a running JupyterLab."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / "tools" / "lab.py"
PLUGIN = "@jupyterlab/apputils-extension:notification"


def test_dry_run_writes_the_news_override_keeping_other_settings(tmp_path: Path) -> None:
    settings = tmp_path / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    settings.parent.mkdir(parents=True)
    settings.write_text(json.dumps({"@jupyterlab/apputils-extension:themes": {"theme": "x"}}))
    out = subprocess.run([sys.executable, str(LAB), "--dry-run", "--prefix", str(tmp_path),
                          "--port", "8899", "--no-browser"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    written = json.loads(settings.read_text())
    assert written[PLUGIN] == {"fetchNews": "false", "checkForUpdates": False}
    assert written["@jupyterlab/apputils-extension:themes"] == {"theme": "x"}
    url = re.search(r"Open notebook 01 at: (\S+)", out.stdout)
    assert url, out.stdout
    assert re.fullmatch(r"http://127\.0\.0\.1:8899/lab/tree/notebooks/01-quickstart\.ipynb"
                        r"\?token=[0-9a-f]{32}", url.group(1))
    assert "token=" not in out.stdout.split("would run:")[1]  # the token is not an argument


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_printed_url_opens_notebook_01_with_news_off(tmp_path: Path) -> None:
    if importlib.util.find_spec("jupyterlab") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("jupyterlab is in the dev extra: CI must install it to run `make lab`")
        pytest.skip("jupyterlab is not installed (pip install -e '.[dev]')")
    from services import free_port

    port = free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "user-settings")}
    proc = subprocess.Popen([sys.executable, str(LAB), "--prefix", str(tmp_path),
                             "--app-settings-dir", str(tmp_path), "--port", str(port),
                             "--no-browser"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        url = ""
        while not url:
            line = proc.stdout.readline()
            assert line, "tools/lab.py exited before printing the URL"
            if line.startswith("Open notebook 01 at: "):
                url = line.split(": ", 1)[1].strip()
        token = url.split("token=")[1]
        deadline = time.monotonic() + 90
        while True:
            try:
                page = urllib.request.urlopen(url, timeout=5).read().decode()
                break
            except OSError:
                assert time.monotonic() < deadline, "JupyterLab did not answer"
                time.sleep(0.5)
        assert "JupyterLab" in page
        api = (f"http://127.0.0.1:{port}/lab/api/settings/{PLUGIN}?token={token}")
        settings = json.loads(urllib.request.urlopen(api, timeout=10).read())
        # overrides become the schema's defaults, which is what the frontend reads
        props = settings["schema"]["properties"]
        assert props["fetchNews"]["default"] == "false", props["fetchNews"]
        assert props["checkForUpdates"]["default"] is False
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
