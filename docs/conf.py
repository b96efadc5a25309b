"""Sphinx configuration of the Istos documentation (``make docs``)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path[:0] = [str(ROOT), str(DOCS / "_ext")]

import istos  # noqa: E402  (after the path is set)

project = "Istos"
author = "The Istos authors"
copyright = "The Istos authors, Apache-2.0"  # noqa: A001  (Sphinx's name)
release = version = istos.__version__

extensions = [
    "myst_nb",                 # MyST Markdown pages and the notebooks, never executed
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinxarg.ext",           # the CLI page, from istos.ops.cli.parser()
    "istos_docs",              # docs/_ext: the API from __all__, options from the code
]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
nb_execution_mode = "off"      # notebooks are shown as committed (they carry no outputs)
nb_merge_streams = True

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False}
autodoc_mock_imports: list[str] = []

html_theme = "furo"
html_title = f"Istos {release}"
html_static_path: list[str] = []

exclude_patterns = ["_build", "_ext", "security/*.sh", "Thumbs.db", ".DS_Store"]
suppress_warnings: list[str] = []

# The notebooks live in notebooks/ (where `make lab` opens them); Sphinx reads only its
# source folder, so they are copied to docs/notebooks/ (gitignored) before every build.
_NB_SRC, _NB_DST = ROOT / "notebooks", DOCS / "notebooks"


def _copy_notebooks() -> None:
    _NB_DST.mkdir(exist_ok=True)
    wanted = {p.name for p in _NB_SRC.glob("*.ipynb")}
    for stale in _NB_DST.glob("*.ipynb"):
        if stale.name not in wanted:
            stale.unlink()
    for src in _NB_SRC.glob("*.ipynb"):
        dst = _NB_DST / src.name
        if not dst.exists() or dst.read_bytes() != src.read_bytes():
            shutil.copyfile(src, dst)


_copy_notebooks()
