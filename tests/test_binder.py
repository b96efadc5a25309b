"""Binder: an environment built from the files in binder/ alone runs the quickstart notebook.

The test does what repo2docker does with this repository, minus Docker: a fresh virtualenv
stands in for the base image's Python, ``pip install -r binder/requirements.txt`` installs what
the notebooks need, and ``binder/postBuild`` runs from the repository root (repo2docker runs
``chmod +x binder/postBuild && ./binder/postBuild`` with the repository as its working
directory). It works on a copy of the repository, so the build leaves nothing in the checkout.
pip uses the machine's cache for the requirements; postBuild itself says ``--no-cache-dir``,
as it should inside an image. About a minute on 2 cores.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD_TIMEOUT_S = 420

# Local state that is not part of what Binder checks out of the repository.
_NOT_IN_A_CHECKOUT = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache",
                      ".ipynb_checkpoints", "build", "dist", "test-artifacts", ".ref-venv",
                      "results"}

# Runs inside the Binder environment: executes one notebook on that environment's own kernel.
DRIVER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path

    import nbformat
    from nbclient import NotebookClient
    from traitlets.config import Config

    notebook, jupyter_dir = Path(sys.argv[1]), Path(sys.argv[2])
    spec_dir = jupyter_dir / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)", "language": "python"}))
    nb = nbformat.read(notebook, as_version=4)
    started = time.perf_counter()
    # Unix sockets, not TCP ports another process of the run could take (tests/kernels.py).
    ipc = Config({"KernelManager": {"transport": "ipc", "ip": str(jupyter_dir / "kernel")}})
    NotebookClient(nb, timeout=60, kernel_name="python3", config=ipc,
                   resources={"metadata": {"path": str(notebook.parent)}}).execute()
    print(f"executed in {time.perf_counter() - started:.1f} s")
""")


def _ignore(directory: str, names: list[str]) -> set[str]:
    return {n for n in names if n in _NOT_IN_A_CHECKOUT or n.endswith(".egg-info")}


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, **kwargs)
    assert out.returncode == 0, f"{cmd} failed:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.mark.slow
@pytest.mark.timeout(2 * BUILD_TIMEOUT_S)
def test_binder_files_alone_build_an_environment_that_runs_the_quickstart(tmp_path: Path):
    started = time.perf_counter()
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=_ignore)
    post_build = repo / "binder" / "postBuild"
    assert post_build.read_text().startswith("#!/usr/bin/env bash\n")

    env_dir = tmp_path / "binder-env"
    _run([sys.executable, "-m", "venv", str(env_dir)])
    bin_dir = env_dir / "bin"
    python = str(bin_dir / "python")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "JUPYTER_PATH")}
    # PIP_NO_COMPILE: pip writes no bytecode for the thousands of modules it installs (a quarter of
    # the build's time); Python compiles the few the notebook imports when it imports them.
    env.update(PATH=str(bin_dir) + os.pathsep + env.get("PATH", ""), VIRTUAL_ENV=str(env_dir),
               PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_COMPILE="1", JUPYTER_PLATFORM_DIRS="1",
               IPYTHONDIR=str(tmp_path / "ipython"))

    _run([python, "-m", "pip", "install", "-q", "-r", "binder/requirements.txt"],
         cwd=repo, env=env)
    _run(["bash", "-c", "chmod +x binder/postBuild && ./binder/postBuild"], cwd=repo, env=env)
    built = time.perf_counter() - started
    # The test harness only, not part of what Binder serves: nbclient drives the kernel.
    _run([python, "-m", "pip", "install", "-q", "nbclient"], env=env)

    # The notebook must import the installed package, not the sources next to it.
    where = _run([python, "-c", "import istos, istos_nb; print(istos.__file__)"],
                 cwd=tmp_path, env=env).stdout.strip()
    assert Path(where).is_relative_to(env_dir), where

    out = _run([python, "-c", DRIVER, str(repo / "notebooks" / "01-quickstart.ipynb"),
                str(tmp_path / "jupyter")], env={**env, "JUPYTER_PATH": str(tmp_path / "jupyter")})
    total = time.perf_counter() - started
    print(f"binder environment built in {built:.0f} s; quickstart {out.stdout.strip()}; "
          f"{total:.0f} s in all")
