"""The first five minutes: the README's first screen, its picture, ``make lab`` and ``make demo``.

``make lab`` itself would pip-install into ``.venv``; the test asks make for the commands it
would run (``make -n``) against the interpreter running the suite, and then runs the JupyterLab
command line for real (no browser, a free port, a token), asking the server for the kernel and
the quickstart notebook it was told to open.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import matplotlib.image
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FIGURE = ROOT / "docs" / "img" / "crash-redelivery.png"


def _first_screen() -> str:
    text = README.read_text(encoding="utf-8")
    return text[:text.index("## The three roles")]


def test_readme_first_screen_has_the_three_commands_and_the_picture():
    top = _first_screen()
    for command in ("make demo", "make test", "make lab"):
        assert re.search(rf"^{command}\b", top, re.M), command
    images = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", top)
    assert images == ["docs/img/crash-redelivery.png"]
    assert (ROOT / images[0]).is_file()
    assert "OWNER/REPO" not in README.read_text(encoding="utf-8")  # no Binder placeholder
    assert "BinderHub at your own fork" in top


def test_readme_picture_is_drawn_by_the_script_in_the_repo(tmp_path: Path):
    out = tmp_path / "figure.png"
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "readme_figure.py"), "--out",
                          str(out)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    drawn, committed = matplotlib.image.imread(out), matplotlib.image.imread(FIGURE)
    assert drawn.shape == committed.shape  # the committed picture is this script's output
    assert FIGURE.stat().st_size < 150_000  # small enough for a README


def _make_n(target: str) -> list[str]:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    bin_dir = Path(sys.executable).parent
    # Under `make test` the outer make's MAKELEVEL/MAKEFLAGS would make this one print
    # "Entering/Leaving directory" lines: run it as a top-level make.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    out = subprocess.run([make, "--no-print-directory", "-n", target, f"VENV={bin_dir.parent}",
                          f"BIN={bin_dir}"], cwd=ROOT, capture_output=True, text=True,
                         timeout=30, check=True, env=env)
    return [line for line in out.stdout.replace("\\\n", " ").splitlines() if line.strip()]


def test_make_demo_ends_by_pointing_at_make_lab():
    assert "make lab" in _make_n("demo")[-1]


def test_make_lab_installs_the_lab_extra():
    lab_extra = re.search(r"^lab = \[(.*)\]", (ROOT / "pyproject.toml").read_text(), re.M)
    assert lab_extra is not None
    names = {re.split(r"[<>=\[]", r.strip(' "'))[0] for r in lab_extra.group(1).split(",")}
    assert names >= {"jupyterlab", "ipykernel"}
    assert any("pip install" in line and ".[lab]" in line for line in _make_n("lab"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.timeout(120)
def test_make_lab_serves_the_quickstart_with_the_venv_kernel(tmp_path: Path):
    if importlib.util.find_spec("jupyterlab") is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("jupyterlab is in the dev extra: CI must install it to run `make lab`")
        pytest.skip("jupyterlab is not installed (pip install -e '.[dev]')")
    lab = [line for line in _make_n("lab") if " lab " in line and "jupyter" in line]
    assert len(lab) == 1 and lab[0].rstrip().endswith("notebooks/01-quickstart.ipynb")
    port, token = _free_port(), "first-steps"
    extra = (f"--no-browser --port={port} --ServerApp.ip=127.0.0.1 "
             f"--IdentityProvider.token={token} --ServerApp.open_browser=False")
    cmd = lab[0].replace(" lab ", f" lab {extra} ", 1)
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "config"), "JUPYTER_PLATFORM_DIRS": "1"}
    log = open(tmp_path / "lab.log", "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(["bash", "-c", cmd], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{base}/api/kernelspecs?token={token}",
                                            timeout=5) as reply:
                    specs = reply.read().decode()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError((tmp_path / "lab.log").read_text()) from None
                time.sleep(0.2)
        assert '"python3"' in specs
        # Given a file, the server is rooted at its directory: every notebook is in view.
        url = f"{base}/api/contents/01-quickstart.ipynb?token={token}&content=0"
        with urllib.request.urlopen(url, timeout=10) as reply:
            assert reply.status == 200
        with urllib.request.urlopen(f"{base}/api/contents?token={token}", timeout=10) as reply:
            listing = reply.read().decode()
        assert '"dashboard.ipynb"' in listing and '"08-inspect-a-live-queue.ipynb"' in listing
        assert "JUPYTER_PATH=" in lab[0] and shlex.split(lab[0])[1].endswith("jupyter")
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):  # Lab and any kernel: its own group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            try:
                proc.wait(15)
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()
