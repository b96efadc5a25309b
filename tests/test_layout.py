"""The layout is the architecture: layer contracts, no import circles, the owner's privacy.

The contracts live in pyproject.toml (``[tool.importlinter]``) and run as ``lint-imports`` in
``make test``; these tests also prove that each contract can fail, by planting the import it
forbids in a copy of the packages.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

# One forbidden import per contract: (module file to plant it in, the import line).
PLANTS = {
    "The engine never imports the notebook side": ("istos/errors.py", "import istos_nb"),
    "The pure core does no I/O": ("istos/core/backoff.py", "import istos.storage.memory"),
    "Transports and storage never import the owner":
        ("istos/storage/memory.py", "import istos.owner.persist"),
    "Owner and worker are siblings": ("istos/owner/nudges.py", "import istos.worker.heartbeat"),
    "The simulator reaches the engine through its public ports":
        ("istos_nb/sim/clock.py", "import istos.owner.owner"),
    "The producers reach owners through the client":
        ("istos/sync_producer.py", "import istos.worker.waiting"),
    "The client imports neither the owner nor the worker":
        ("istos/client/pages.py", "import istos.owner.persist"),
}


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin"})


def test_every_layer_contract_holds() -> None:
    out = _lint(ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert f"{len(PLANTS)} kept, 0 broken" in out.stdout


def test_each_contract_breaks_when_its_forbidden_import_appears(tmp_path: Path) -> None:
    for package in ("istos", "istos_nb"):
        shutil.copytree(ROOT / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for path, line in PLANTS.values():
        target = tmp_path / path
        target.write_text(target.read_text() + f"\n{line}  # planted\n")
    out = _lint(tmp_path)
    assert out.returncode != 0
    broken = [line for line in out.stdout.splitlines() if line.rstrip().endswith("BROKEN")]
    assert f"0 kept, {len(PLANTS)} broken" in out.stdout, out.stdout[-3000:]
    for name in PLANTS:
        assert any(name in line for line in broken) or name in out.stdout, name


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(
                        graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_engine_has_no_import_circles_type_checking_imports_included() -> None:
    graph = grimp.build_graph("istos", cache_dir=None)  # TYPE_CHECKING imports count
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    graph = grimp.ImportGraph()
    for a, b in (("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")):
        graph.add_import(importer=a, imported=b)
    assert _cycles(graph) == [["p.a", "p.b", "p.c"]]


def _owner_privates(tree: ast.AST) -> list[tuple[int, str]]:
    """``owner._x`` / ``self.owner._x`` / ``owners[...]._x`` accesses (dunders aside)."""
    hits = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__")):
            continue
        base = node.value
        if isinstance(base, ast.Subscript):
            base = base.value
        name = base.id if isinstance(base, ast.Name) else \
            base.attr if isinstance(base, ast.Attribute) else ""
        if name in ("owner", "owners", "_owner_of_queue"):
            hits.append((node.lineno, node.attr))
    return sorted(hits)


@pytest.mark.parametrize("package", ["istos", "istos_nb"])
def test_no_module_outside_the_owner_uses_its_private_members(package: str) -> None:
    offenders = []
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[:2] == ("istos", "owner") or rel.parts[:2] == ("istos", "transport"):
            continue  # the owner's own modules; the transport's "owner" is its session
        offenders += [f"{rel}:{line} .{attr}"
                      for line, attr in _owner_privates(ast.parse(path.read_text()))]
    assert offenders == []


def test_the_privacy_scan_sees_an_owner_private() -> None:
    tree = ast.parse("async def f(self):\n    await self.owner._commit()\n    owner._gen\n")
    assert sorted(_owner_privates(tree)) == [(2, "_commit"), (3, "_gen")]
