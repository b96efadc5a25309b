"""Layering and packaging: the engine stands alone, the notebook stack is an extra.

``istos`` never imports ``istos_nb`` (nor pandas, matplotlib, ipywidgets), so an engine-only
install needs none of them; the notebook side depends on the engine, not the reverse.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import istos

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_STACK = ("istos_nb", "pandas", "matplotlib", "ipywidgets")

# Imports every istos module in a fresh interpreter, then reports what got loaded.
_PROBE = """
import importlib, json, pkgutil, sys
import istos
names = sorted(m.name for m in pkgutil.walk_packages(istos.__path__, "istos."))
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "loaded": sorted(sys.modules)}))
"""


def test_importing_every_engine_module_loads_no_notebook_stack() -> None:
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                         cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert {"istos.app", "istos.demo", "istos.transport.zenoh", "istos.owner.owner"} \
        <= set(report["imported"])
    loaded = [m for m in report["loaded"] if m.split(".")[0] in NOTEBOOK_STACK]
    assert loaded == []


def test_no_engine_source_names_the_notebook_stack() -> None:
    """Also the imports inside functions, which importing a module does not run."""
    offenders = []
    for path in sorted((ROOT / "istos").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                          if n.split(".")[0] in NOTEBOOK_STACK]
    assert offenders == []


@pytest.fixture(scope="module")
def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # 3.11+; the checks are the same on any version
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _names(requirements: list[str]) -> set[str]:
    return {r.split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip().lower()
            for r in requirements}


def test_engine_dependencies_are_only_zenoh_msgpack_tzdata(pyproject: dict) -> None:
    project = pyproject["project"]
    assert _names(project["dependencies"]) == {"eclipse-zenoh", "msgpack", "tzdata"}
    extras = project["optional-dependencies"]
    # hypothesis: the simulator's explore() generates and shrinks fault schedules with it
    assert _names(extras["notebook"]) == {"pandas", "matplotlib", "ipywidgets", "hypothesis"}
    assert any(d.startswith("istos-nb[") and "notebook" in d for d in extras["dev"])


def test_binder_and_make_demo_install_the_notebook_extra() -> None:
    binder = _names([line for line in (ROOT / "binder/requirements.txt").read_text().splitlines()
                     if line and not line.startswith("#")])
    assert {"pandas", "matplotlib", "ipywidgets"} <= binder
    assert "pip install --no-cache-dir '.[notebook]'" in (ROOT / "binder/postBuild").read_text()
    makefile = (ROOT / "Makefile").read_text()
    demo = makefile[makefile.index("\ndemo:"):].split("\n\n")[0]
    assert "'.[notebook]'" in demo and "istos.demo" in demo and "istos_nb.demo" in demo


def test_version_and_license_are_written_once(pyproject: dict) -> None:
    project = pyproject["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "istos.__version__"}
    assert isinstance(istos.__version__, str) and istos.__version__
    assert project["license"] == "Apache-2.0"
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert "Typing :: Typed" in project["classifiers"]
    for package in ("istos", "istos_nb"):
        assert (ROOT / package / "py.typed").exists()
        assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"][package]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_simulated_half_of_the_demo_passes_every_invariant() -> None:
    out = subprocess.run([sys.executable, "-m", "istos_nb.demo"], capture_output=True, text=True,
                         cwd=ROOT, timeout=110)
    assert out.returncode == 0, out.stderr[-3000:]
    report = [line.strip() for line in out.stdout.splitlines() if line.strip().startswith("[")]
    # Every check holds, or had nothing to check in this run ([n/a]); never a [FAIL].
    assert report and all(line.startswith(("[ok]", "[n/a]")) for line in report), out.stdout
    assert sum(line.startswith("[ok]") for line in report) >= 6, out.stdout


def _without(line: str, parts: tuple[str, ...]) -> str:
    for part in parts:
        line = line.replace(part, "")
    return line


def test_package_sources_point_only_inside_the_repository() -> None:
    """Comments and docstrings cite files of this repository, never links or outside paths."""
    outside = ("http://", "https://", "/work/", "shared/recipes", "shared/spec", "DESIGN.md")
    local = ("http://127.0.0.1", "http://{args.host}", "http://{host}")  # addresses a CLI prints
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for package in ("istos", "istos_nb")
             for path in sorted((ROOT / package).rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if any(mark in _without(line, local) for mark in outside)]
    assert found == []
