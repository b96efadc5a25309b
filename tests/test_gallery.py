"""The docs' screenshot gallery (tools/gallery.py, docs/notebooks.md) shows every notebook's
main chart.

Regenerating it runs every notebook (minutes), so this checks what was committed: the gallery
section of docs/notebooks.md is exactly what the tool writes for the notebooks that tag a main
chart, and each picture exists and is small. ``python tools/gallery.py`` fixes both.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.fast  # `make check`: no process, server or session

ROOT = Path(__file__).resolve().parent.parent


def gallery() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gallery", ROOT / "tools" / "gallery.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_teaching_notebook_tags_exactly_one_main_chart() -> None:
    for path in sorted((ROOT / "notebooks").glob("[0-9]*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        tagged = [c for c in cells if "gallery" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1 and tagged[0]["cell_type"] == "code", path.name


def test_docs_gallery_is_what_the_tool_writes_and_its_pictures_are_small() -> None:
    g = gallery()
    names = [p.stem for p in sorted(g.NOTEBOOKS.glob("*.ipynb")) if g.tagged(p)]
    assert len(names) >= 10
    page = (ROOT / "docs" / "notebooks.md").read_text(encoding="utf-8")
    assert g.gallery_section(names) in page, "run: python tools/gallery.py"
    for name in names:
        png = ROOT / "docs" / "img" / "gallery" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert png.stat().st_size < g.MAX_BYTES, name
