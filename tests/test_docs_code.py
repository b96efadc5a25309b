"""Every code block in the docs either runs here or says on purpose that it is an excerpt.

A fenced block in ``docs/**/*.md`` (and ``README.md``) is runnable when its language is
``python`` and the line just before its fence is not an excerpt marker; every other block (a
shell session, a config file, code that needs a live owner or names your own functions) must
carry the marker ``<!-- excerpt: why -->`` on that line. The runnable blocks of one page run in
order, in one fresh interpreter (as a reader would paste them into one session), from the
repository root; they use only the simulator and files in the repository, so this stays fast.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SKIP_DIRS = {"_build", "notebooks", "jupyter_execute", "_ext"}
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)$")
MARKER = re.compile(r"^<!-- excerpt(:[^>]*)? -->$")


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    info: str
    code: str
    excerpt: bool


def pages() -> list[Path]:
    found = [p for p in DOCS.rglob("*.md")
             if not SKIP_DIRS.intersection(p.relative_to(DOCS).parts)]
    return sorted(found) + [ROOT / "README.md"]


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a Markdown page, indented ones (in a list item) included. A MyST
    directive such as ```{toctree} or ```{literalinclude} is not a code block: its info string
    starts with ``{``."""
    lines = page.read_text(encoding="utf-8").splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m["fence"], m["info"].strip()
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        previous = lines[i - 1].strip() if i > 0 else ""
        if not info.startswith("{"):
            indent = len(m["indent"])
            code = "\n".join(line[indent:] for line in lines[i + 1:end])
            out.append(Block(page, i + 1, info, code, bool(MARKER.match(previous))))
        i = end + 1
    return out


def _id(page: Path) -> str:
    return str(page.relative_to(ROOT))


ALL_PAGES = pages()


def test_the_collector_finds_the_docs() -> None:
    names = {_id(p) for p in ALL_PAGES}
    assert "docs/tutorials/crash-and-lease-chart.md" in names
    assert "docs/protocol.md" in names and "README.md" in names
    runnable = [b for p in ALL_PAGES for b in blocks(p) if not b.excerpt]
    assert len(runnable) >= 4, runnable  # the simulator pages really run here


@pytest.mark.parametrize("page", ALL_PAGES, ids=_id)
def test_every_block_runs_or_is_marked_an_excerpt(page: Path) -> None:
    unmarked = [f"{_id(page)}:{b.line} ({b.info or 'no language'})" for b in blocks(page)
                if not b.excerpt and b.info != "python"]
    assert not unmarked, ("mark these '<!-- excerpt: why -->' on the line before the fence, "
                          f"or make them runnable python: {unmarked}")


RUNNABLE = [p for p in ALL_PAGES if any(not b.excerpt for b in blocks(p))]


@pytest.mark.parametrize("page", RUNNABLE, ids=_id)
def test_runnable_blocks_run(page: Path) -> None:
    code = "\n\n".join(f"# {_id(page)}:{b.line}\n{b.code}" for b in blocks(page)
                       if not b.excerpt)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=110)
    assert run.returncode == 0, f"{_id(page)}:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}"
