"""Regenerate the docs' screenshot gallery (docs/notebooks.md): each notebook's main chart,
from its own run.

    python tools/gallery.py              # runs the notebooks, writes docs/img/gallery/*.png
    python tools/gallery.py --only 03-leases 07-workflows

Each notebook marks its main chart by tagging that code cell ``gallery``. The tool executes
every such notebook top to bottom (in a temporary copy, on a kernel from this interpreter, as
``tests/test_notebooks.py`` does), takes the PNG the tagged cell displayed, writes it to
``docs/img/gallery/<notebook>.png`` and rewrites ``docs/notebooks.md`` between the
``gallery:start`` and ``gallery:end`` markers: one row per notebook, its title and its chart.
Needs the ``dev`` extras (nbclient, ipykernel) and, for notebook 08, free loopback ports; takes
a few minutes.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
OUT = ROOT / "docs" / "img" / "gallery"
PAGE = ROOT / "docs" / "notebooks.md"
TAG = "gallery"
START, END = "<!-- gallery:start -->", "<!-- gallery:end -->"
MAX_BYTES = 300_000  # a committed picture stays small


def tagged(path: Path) -> bool:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return any(TAG in c.get("metadata", {}).get("tags", []) for c in nb["cells"])


def title_of(path: Path) -> str:
    nb = json.loads(path.read_text(encoding="utf-8"))
    first = "".join(nb["cells"][0]["source"]).splitlines()[0]
    return first.lstrip("# ").strip()


def _kernel_env(tmp: Path) -> None:
    spec = tmp / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (ipykernel)", "language": "python"}), encoding="utf-8")
    os.environ["JUPYTER_PATH"] = str(tmp / "jupyter")
    os.environ["IPYTHONDIR"] = str(tmp / "ipython")
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]


def chart_png(work: Path, name: str) -> bytes:
    """Run ``work/name.ipynb``; the PNG its ``gallery`` cell displayed."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(work / f"{name}.ipynb", as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(work)}}).execute()
    for cell in nb.cells:
        if TAG in cell.get("metadata", {}).get("tags", []):
            for out in cell.get("outputs", []):
                png = out.get("data", {}).get("image/png")
                if png:
                    return base64.b64decode(png)
    raise SystemExit(f"{name}: the cell tagged {TAG!r} displayed no PNG")


def gallery_section(names: list[str]) -> str:
    """The table between the markers; paths are relative to docs/ (the notebooks are copied
    to docs/notebooks/ by the docs build)."""
    rows = [f"| [{title_of(NOTEBOOKS / f'{n}.ipynb')}](notebooks/{n}.ipynb) | "
            f"![{n}: main chart](img/gallery/{n}.png) |" for n in names]
    return "\n".join([START, "| notebook | its main chart |", "|---|---|", *rows, END])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=None, help="notebook stems to redraw")
    args = parser.parse_args(argv)
    names = [p.stem for p in sorted(NOTEBOOKS.glob("*.ipynb")) if tagged(p)]
    todo = [n for n in names if args.only is None or n in args.only]
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        _kernel_env(tmp)
        work = tmp / "notebooks"
        shutil.copytree(NOTEBOOKS, work, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
        for name in todo:
            png = chart_png(work, name)
            if len(png) > MAX_BYTES:
                raise SystemExit(f"{name}: chart is {len(png):,} bytes (> {MAX_BYTES:,})")
            (OUT / f"{name}.png").write_bytes(png)
            print(f"wrote {OUT / f'{name}.png'} ({len(png):,} bytes)", flush=True)
    text = PAGE.read_text(encoding="utf-8")
    if START not in text or END not in text:
        raise SystemExit(f"{PAGE} has no {START} ... {END} section")
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    PAGE.write_text(head + gallery_section(names) + tail, encoding="utf-8")
    print(f"updated the gallery in {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
