"""A private Jupyter kernelspec for tests that start real kernels: ``python3`` runs this
interpreter's ipykernel, found before any user-level kernelspec, with IPython's history kept
out of ``$HOME`` and the repo (plus whatever was on ``PYTHONPATH``) importable in the kernel."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def write_kernelspec(jupyter_dir: Path, python: str = sys.executable) -> None:
    """A ``python3`` kernelspec under ``jupyter_dir`` that starts ``python``'s ipykernel."""
    spec_dir = jupyter_dir / "kernels" / "python3"
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {"argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (ipykernel)", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")


def private_kernel_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point Jupyter at a kernelspec of this interpreter under ``tmp_path`` (for this test)."""
    write_kernelspec(tmp_path / "jupyter")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))  # searched before the rest
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))  # no history in $HOME
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
