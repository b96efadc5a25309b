"""The notebooks under notebooks/: each runs top to bottom without an error, and each is
committed without outputs. Each run's seconds are printed and recorded as a junit property
(the target is under 60 s on a 2-core machine; they take 5-20 s there).

Every notebook runs in a temporary copy of the notebooks directory (so outputs never land in
the repository, and ``08`` finds ``live_demo_node.py`` next to it) on a kernel started from
*this* interpreter: a kernelspec written for the test and put first on ``JUPYTER_PATH``, so
neither a user-level ``python3`` kernelspec nor a ``python`` found elsewhere on PATH can stand
in for the virtualenv the suite runs from. That is how a clean ``.venv`` made by ``make test``
resolves the kernel with nothing activated.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from kernels import notebook_client, private_kernel_env

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
STRIP = ROOT / "tools" / "strip_notebooks.py"

# Guards against a hang, not speed bounds: the suite runs four workers on two cores, so a
# CPU-bound cell can take several times what it takes alone.
CELL_TIMEOUT_S = 180
NOTEBOOK_TIMEOUT_S = 420


@pytest.fixture
def kernel_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    private_kernel_env(tmp_path, monkeypatch)
    # What the notebooks start themselves (08's subprocesses) comes from the same venv too.
    bin_dir = str(Path(sys.executable).parent)
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ.get("PATH", ""))


def copy_notebooks(dest: Path) -> Path:
    shutil.copytree(NOTEBOOK_DIR, dest,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    return dest


def stderr_of(nb: nbformat.NotebookNode) -> list[str]:
    return [f"cell {i}: {out.get('text', '')}" for i, cell in enumerate(nb.cells)
            for out in cell.get("outputs", [])
            if out.get("output_type") == "stream" and out.get("name") == "stderr"]


def test_there_are_notebooks_to_run():
    names = {p.stem for p in NOTEBOOKS}
    assert {"01-quickstart", "02-jobs-vs-events", "03-leases", "04-backoff-and-jitter",
            "05-poison-jobs", "06-clock-skew-and-failover", "07-workflows",
            "08-inspect-a-live-queue", "10-how-many-workers",
            "11-replay-a-production-hour", "13-how-can-a-job-run-twice"} <= names


@pytest.mark.slow
@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path: Path, tmp_path: Path, kernel_env: None,
                                     record_property: pytest.RecordProperty):
    work = copy_notebooks(tmp_path / "notebooks")
    nb = nbformat.read(work / path.name, as_version=4)
    client = notebook_client(nb, tmp_path, timeout=CELL_TIMEOUT_S, cwd=work)
    started = time.perf_counter()
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    elapsed = time.perf_counter() - started
    record_property("seconds", round(elapsed, 1))
    print(f"{path.name}: {elapsed:.1f} s")
    assert not stderr_of(nb), stderr_of(nb)  # a teaching notebook prints no warnings


# -- committed notebooks carry no outputs ----------------------------------------------------------


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebook_has_no_outputs(path: Path):
    nb = json.loads(path.read_text(encoding="utf-8"))
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [], f"{path.name} cell {i} has outputs"
            assert cell.get("execution_count") is None, f"{path.name} cell {i} was run"
    assert "widgets" not in nb.get("metadata", {}), f"{path.name} carries widget state"


def test_strip_tool_reports_nothing_to_strip():
    out = subprocess.run([sys.executable, str(STRIP), "--check"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout == ""


def test_strip_tool_restores_a_run_notebook_to_its_committed_form(tmp_path: Path):
    original = NOTEBOOKS[0].read_text(encoding="utf-8")
    nb = json.loads(original)
    run = copy.deepcopy(nb)
    run["metadata"]["widgets"] = {"application/vnd.jupyter.widget-state+json": {}}
    for n, cell in enumerate(c for c in run["cells"] if c["cell_type"] == "code"):
        cell["execution_count"] = n + 1
        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["hello\n"]}]
        cell["metadata"]["execution"] = {"iopub.status.idle": "2026-01-01T00:00:00Z"}
    dirty = tmp_path / NOTEBOOKS[0].name
    dirty.write_text(json.dumps(run, indent=2), encoding="utf-8")
    check = subprocess.run([sys.executable, str(STRIP), "--check", str(dirty)],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 1 and "would strip" in check.stdout
    assert json.loads(dirty.read_text(encoding="utf-8")) == run  # --check wrote nothing
    fixed = subprocess.run([sys.executable, str(STRIP), str(dirty)], capture_output=True,
                           text=True, timeout=60)
    assert fixed.returncode == 0, fixed.stderr
    assert dirty.read_text(encoding="utf-8") == original


# -- the glossary ----------------------------------------------------------------------------------

GLOSSARY_TERMS = ("Lease", "Attempt", "Redelivery", "Duplicate", "Stranded", "Dead letter")


def test_the_glossary_defines_every_term():
    nb = json.loads((NOTEBOOK_DIR / "glossary.ipynb").read_text(encoding="utf-8"))
    headings = ["".join(c["source"]).splitlines()[0] for c in nb["cells"]
                if c["cell_type"] == "markdown"]
    for term in GLOSSARY_TERMS:
        assert f"## {term}" in headings, (term, headings)


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem != "glossary"],
                         ids=[p.stem for p in NOTEBOOKS if p.stem != "glossary"])
def test_every_notebook_links_the_glossary_from_its_first_cell(path: Path):
    first = json.loads(path.read_text(encoding="utf-8"))["cells"][0]
    assert first["cell_type"] == "markdown"
    assert "](glossary.ipynb)" in "".join(first["source"]), f"{path.name}: link the glossary"
