"""Strip outputs and execution counts from notebooks before they are committed.

    python tools/strip_notebooks.py               # every notebooks/*.ipynb, rewritten in place
    python tools/strip_notebooks.py A.ipynb ...   # just these
    python tools/strip_notebooks.py --check       # change nothing; exit 1 naming the dirty ones

Besides outputs and execution counts it drops what a run leaves behind: per-cell timing
metadata (``execution``, ``ExecuteTime``) and the saved widget state (notebook metadata
``widgets``). Everything else, cell ids and sources included, is kept. Files are written the
way nbformat writes them (one-space indent, sorted keys, sources as lists of lines), so a
notebook saved by Jupyter and then stripped differs from the committed one only where its
content differs. Needs nothing beyond the standard library.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RUN_CELL_METADATA = ("execution", "ExecuteTime")
RUN_NOTEBOOK_METADATA = ("widgets",)


def _lines(source: Any) -> Any:
    """A cell source as nbformat stores it: a list of lines, each but the last ending in \\n."""
    if isinstance(source, str):
        return source.splitlines(keepends=True)
    return source


def strip(nb: dict[str, Any]) -> dict[str, Any]:
    """Return ``nb`` (a parsed .ipynb) without outputs, counts or run metadata. In place."""
    for key in RUN_NOTEBOOK_METADATA:
        nb.get("metadata", {}).pop(key, None)
    for cell in nb.get("cells", []):
        cell["source"] = _lines(cell.get("source", []))
        for key in RUN_CELL_METADATA:
            cell.get("metadata", {}).pop(key, None)
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    return nb


def dumps(nb: dict[str, Any]) -> str:
    return json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False,
                      separators=(",", ": ")) + "\n"


def stripped_text(path: Path) -> tuple[str, str]:
    """(current text, stripped text) of one notebook file."""
    text = path.read_text(encoding="utf-8")
    return text, dumps(strip(json.loads(text)))


def default_paths() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("*.ipynb"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path,
                        help="notebooks to strip (default: notebooks/*.ipynb)")
    parser.add_argument("--check", action="store_true",
                        help="report notebooks that would change and exit 1 if any; write nothing")
    args = parser.parse_args(argv)
    dirty = []
    for path in args.paths or default_paths():
        text, clean = stripped_text(path)
        if text == clean:
            continue
        dirty.append(path)
        if not args.check:
            path.write_text(clean, encoding="utf-8")
    verb = "would strip" if args.check else "stripped"
    for path in dirty:
        print(f"{verb} {path}")
    return 1 if args.check and dirty else 0


if __name__ == "__main__":
    sys.exit(main())
