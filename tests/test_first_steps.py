"""The first five minutes: the README's first screen, the docs' picture, ``make lab`` and
``make demo``.

``make lab`` itself would pip-install into ``.venv``; the test asks make for the commands it
would run (``make -n``) against the interpreter running the suite, and then runs the JupyterLab
command line for real (no browser, a free port, a token), asking the server for the kernel and
the quickstart notebook it was told to open.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FIGURE = ROOT / "docs" / "img" / "crash-redelivery.png"


WORDS = re.compile(r"\S+")


def _readme() -> str:
    return README.read_text(encoding="utf-8")


def test_readme_is_a_short_landing_page_with_the_quickstart_on_its_first_screen():
    text = _readme()
    assert len(WORDS.findall(text)) <= 1_600  # a landing page; the rest is in docs/
    # The two-terminal quickstart within the first ~300 words, naming files that exist.
    first = text[:text.index("python examples/producer.py")]
    assert len(WORDS.findall(first)) <= 300
    assert "python examples/owner_worker.py" in first
    for example in ("owner_worker.py", "producer.py", "producer_sync.py"):
        assert f"examples/{example}" in text
    for command in ("make demo", "make test", "make lab", "make docs"):
        assert re.search(rf"^{command}\b", text, re.M), command
    assert "istos-nb" in text and "do not install both in one environment" in text


def test_readme_renders_on_a_package_index():
    """No picture that only resolves in a checkout (the long description is this file), and
    every relative link names a file of the repository."""
    text = _readme()
    assert not re.findall(r"!\[[^\]]*\]\(", text) and "<img" not in text
    for target in re.findall(r"\]\(([^)#\s]+)", text):
        if not re.match(r"[a-z]+://", target):
            assert (ROOT / target).exists(), target
    assert "OWNER/REPO" not in text  # no Binder placeholder


def test_the_docs_show_the_picture_and_say_how_to_run_the_notebooks_on_binder():
    page = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    images = re.findall(r"!\[[^\]]+\]\(([^)]+)\)", page)
    assert images == ["img/crash-redelivery.png"]
    assert (ROOT / "docs" / images[0]).resolve() == FIGURE
    notebooks = (ROOT / "docs" / "notebooks.md").read_text(encoding="utf-8")
    assert "BinderHub at your own fork" in notebooks and "make lab" in notebooks


def test_readme_picture_is_drawn_by_the_script_in_the_repo(tmp_path: Path):
    out = tmp_path / "figure.png"
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "readme_figure.py"), "--out",
                          str(out)], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    drawn, committed = matplotlib.image.imread(out), matplotlib.image.imread(FIGURE)
    assert drawn.shape == committed.shape  # the committed picture is this script's output
    assert FIGURE.stat().st_size < 150_000  # small enough for a page


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


def test_make_lab_runs_tools_lab_with_the_venv_kernel_path():
    """`make lab` starts tools/lab.py with this venv's Jupyter path; tests/test_lab.py starts
    it for real and opens notebook 01 (jupyterlab is in the dev extra, so CI runs that)."""
    lab = [line for line in _make_n("lab") if "tools/lab.py" in line]
    assert len(lab) == 1 and "JUPYTER_PATH=" in lab[0]
    assert shlex.split(lab[0])[1].endswith("python")
