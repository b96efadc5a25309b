"""A private Jupyter kernelspec for tests that start real kernels: ``python3`` runs this
interpreter's ipykernel, found before any user-level kernelspec, with IPython's history kept
out of ``$HOME`` and the repo (plus whatever was on ``PYTHONPATH``) importable in the kernel.

Kernels started through :func:`notebook_client` talk over Unix sockets, not TCP. With TCP,
jupyter_client picks five free ports by binding and closing them, and the kernel binds them
a moment later: in between, any other process of the run (another worker's kernel, a Zenoh
or Redis connection's local end) may take one. That window is the suspected cause of a kernel
that never answered in a loaded run ("Kernel didn't respond in 60 seconds"); a socket file
under the test's own directory has no such window."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient
from traitlets.config import Config

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


def ipc_kernel_config(sockets: Path) -> Config:
    """Kernel manager settings: the kernel's five channels as Unix sockets named
    ``sockets``-1, -2, ... (an absolute path: the kernel runs in the notebook's directory)."""
    sockets.parent.mkdir(parents=True, exist_ok=True)
    return Config({"KernelManager": {"transport": "ipc", "ip": str(sockets.resolve())}})


def notebook_client(nb: nbformat.NotebookNode, tmp_path: Path, *, timeout: int,
                    cwd: Path, **kwargs: Any) -> NotebookClient:
    """An nbclient for ``nb`` on the private ``python3`` kernel, run in ``cwd``, its
    sockets under ``tmp_path`` (see the module docstring)."""
    return NotebookClient(nb, timeout=timeout, kernel_name="python3",
                          resources={"metadata": {"path": str(cwd)}},
                          config=ipc_kernel_config(tmp_path / "ipc" / "kernel"), **kwargs)
