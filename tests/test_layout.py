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
        ("istos/storage/memory.py", "import istos.owner.persistence.persist"),
    "Owner and worker are siblings":
        ("istos/owner/handlers/nudges.py", "import istos.worker.heartbeat"),
    "The simulator reaches the engine through its public ports":
        ("istos_nb/sim/clock.py", "import istos.owner.owner"),
    "The notebook side is layered": ("istos_nb/data/frames.py", "import istos_nb.sim.network"),
    "The producers reach owners through the client":
        ("istos/sync_producer.py", "import istos.worker.waiting"),
    "The client imports neither the owner nor the worker":
        ("istos/client/pages.py", "import istos.owner.persistence.persist"),
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


@pytest.mark.parametrize("package", ["istos", "istos_nb"])
def test_no_import_circles_type_checking_imports_included(package: str) -> None:
    graph = grimp.build_graph(package, cache_dir=None)  # TYPE_CHECKING imports count
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


# The one module of istos_nb allowed to touch other objects' `_`-members: asyncio's internals,
# re-implemented for the virtual loop and the nested run of a running loop.
ASYNCIO_INTERNALS = "istos_nb/asyncio_internals.py"


def _own_private_names(tree: ast.AST) -> set[str]:
    """The `_`-names a module defines itself: its functions, classes, variables and import
    aliases, and the members its own classes set on ``self``/``cls`` or declare."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            names.add(node.attr)
    return {n for n in names if n.startswith("_")}


def _private_reach_ins(tree: ast.AST) -> list[tuple[int, str]]:
    """``x._name`` where ``x`` is not ``self``/``cls`` and ``_name`` is not the module's own,
    and ``from m import _name`` (dunders aside)."""
    own = _own_private_names(tree)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name, base = node.attr, node.value
            if (not name.startswith("_") or name.startswith("__") or name in own
                    or (isinstance(base, ast.Name) and base.id in ("self", "cls"))):
                continue
            hits.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            module = "." * node.level + (node.module or "")
            hits += [(node.lineno, f"from {module} import {a.name}") for a in node.names
                     if a.name.startswith("_") and not a.name.startswith("__")]
    return sorted(hits)


def test_no_notebook_module_uses_another_objects_private_members() -> None:
    """Engine objects, other modules' objects, asyncio's: only through public names, except in
    the one module that re-implements asyncio's internals."""
    assert (ROOT / ASYNCIO_INTERNALS).exists()
    offenders = []
    for path in sorted((ROOT / "istos_nb").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.as_posix() == ASYNCIO_INTERNALS:
            continue
        offenders += [f"{rel}:{line} {what}"
                      for line, what in _private_reach_ins(ast.parse(path.read_text()))]
    assert offenders == []


def test_the_reach_in_scan_sees_a_private_member() -> None:
    source = ("from .vloop import _ambient\n"
              "class A:\n"
              "    def __init__(self):\n"
              "        self._mine = 1\n"
              "    def f(self, other, sim):\n"
              "        other._mine, self._x, sim.__class__\n"
              "        return sim._loop, sim.world.shared_storage._data\n")
    assert _private_reach_ins(ast.parse(source)) == [
        (1, "from .vloop import _ambient"), (7, "sim._loop"),
        (7, "sim.world.shared_storage._data")]


def test_notebook_modules_sharing_a_file_name_are_one_concept_at_two_layers() -> None:
    """Two modules of one file name must be one concept at two layers, and say so (each names
    the other in its docstring)."""
    by_name: dict[str, list[Path]] = {}
    for path in sorted((ROOT / "istos_nb").rglob("*.py")):
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(path)
    unexplained = []
    for paths in by_name.values():
        dotted = [".".join(p.relative_to(ROOT).with_suffix("").parts) for p in paths]
        for path, me in zip(paths, dotted, strict=True):
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            if len(paths) > 1 and not ("two layers" in doc and all(
                    other in doc for other in dotted if other != me)):
                unexplained.append(me)
    assert unexplained == []


# A shared file name is one concept at two (or three) layers, and each module says so.
SAME_CONCEPT = ("one module at two layers", "one concept at", "one role in")


def _words(path: Path) -> str:
    """A module's docstring, lower case, one space between words."""
    return " ".join((ast.get_docstring(ast.parse(path.read_text())) or "").split()).lower()


def test_modules_that_share_a_file_name_say_they_are_one_concept() -> None:
    by_name: dict[str, list[Path]] = {}
    for package in ("istos", "istos_nb"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name != "__init__.py":
                by_name.setdefault(path.name, []).append(path)
    silent = [str(path.relative_to(ROOT)) for paths in by_name.values() if len(paths) > 1
              for path in paths
              if not any(words in _words(path) for words in SAME_CONCEPT)]
    assert silent == [], f"same file name as another module, and not said to be one concept: "\
                         f"{silent} (rename, or say so in the module docstring)"
