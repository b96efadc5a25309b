"""Docstrings state contracts, and the error tree drawn in ``istos/errors.py`` is the real one.

The gate: every exported name of ``istos`` and ``istos_nb``, and every public method and
property of the classes a user calls most, has a docstring of at least one full sentence; a
callable whose own body raises says so; an async twin may instead say "As :meth:`x`,
awaitable"; no docstring carries history (issue numbers). The tree: every exception class
the packages define is drawn, under its real parent, with the builtins it also derives from,
and every exported one derives from :class:`istos.IstosError`.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import inspect
import pkgutil
import re
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

import istos
import istos_nb
import istos_nb.sim
from istos.delegate import delegate
from istos_nb.sim import SimResult, Simulation, Trace

CLASSES = [istos.Istos, istos.JobContext, istos.SyncProducer, istos_nb.LiveQueue, Simulation,
           SimResult, Trace]
MIN_WORDS = 6
TWIN = re.compile(r"^As :(?:meth|func):`~?([\w.]+)`, awaitable\b")
HISTORY = re.compile(r"\bissues? #?\d+|\bpreviously\b|\bformerly\b", re.I)
# The exported exception that is deliberately not an IstosError, and why.
NOT_ISTOS = {
    "HandlerFailure": "a simulated handler's own failure: it stands for the application's "
                      "exception, which Istos never wraps",
}


def _own_doc(obj: Any) -> str:
    """The docstring written for ``obj`` itself (not a dataclass's generated signature)."""
    if inspect.isclass(obj):
        doc = obj.__dict__.get("__doc__")
    else:
        doc = getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc) if doc else ""


def _function(obj: Any) -> Any:
    """The function behind a method-like attribute (None for data attributes)."""
    if isinstance(obj, (staticmethod, classmethod)):
        return obj.__func__
    if isinstance(obj, property):
        return obj.fget
    if isinstance(obj, functools.cached_property):
        return obj.func
    if isinstance(obj, delegate):
        return obj.method
    return obj if inspect.isfunction(obj) else None


def targets() -> Iterator[tuple[str, Any, Any]]:
    """(label, the object whose docstring counts, its function or None)."""
    for module in (istos, istos_nb):
        for name in module.__all__:
            obj = getattr(module, name)
            yield f"{module.__name__}.{name}", obj, obj if inspect.isfunction(obj) else None
    for cls in CLASSES:
        if cls not in (istos.Istos, istos.JobContext, istos.SyncProducer, istos_nb.LiveQueue):
            yield cls.__name__, cls, None
        for name, attr in sorted(vars(cls).items()):
            fn = _function(attr)
            if not name.startswith("_") and fn is not None:
                shown = attr if isinstance(attr, (property, delegate)) else fn
                yield f"{cls.__name__}.{name}", shown, fn


def _raises_itself(fn: Any) -> bool:
    """Whether ``fn``'s own body (not a nested function's) has a ``raise`` statement."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return False
    tree = ast.parse(source).body[0]

    def walk(node: ast.AST) -> Iterator[ast.AST]:
        for child in ast.iter_child_nodes(node):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                      ast.ClassDef)):
                yield child
                yield from walk(child)

    return any(isinstance(node, ast.Raise) for node in walk(tree))


def _is_sentence(doc: str) -> bool:
    return len(doc.split()) >= MIN_WORDS and re.search(r"[.!?](\s|$)", doc) is not None


TARGETS = list(targets())


@pytest.mark.parametrize(("label", "obj", "fn"), TARGETS, ids=[t[0] for t in TARGETS])
def test_docstring_states_a_contract(label: str, obj: Any, fn: Any):
    doc = _own_doc(obj)
    assert doc, f"{label} has no docstring"
    twin = TWIN.match(doc)
    if twin:  # an async twin points at its blocking original, which must exist
        owner = label.rsplit(".", 1)[0]
        scope = {"LiveQueue": istos_nb.LiveQueue, "Simulation": Simulation}.get(owner, istos_nb)
        assert hasattr(scope, twin.group(1)), f"{label}: no {twin.group(1)} to be the twin of"
        return
    assert _is_sentence(doc), f"{label}: the docstring is not a full sentence: {doc!r}"
    if fn is not None and _raises_itself(fn):
        assert "raise" in doc.lower(), f"{label} raises but its docstring does not say what"
    assert not HISTORY.search(doc), f"{label}: history belongs in CHANGELOG.md: {doc!r}"


def test_the_gate_covers_what_it_names():
    labels = {t[0] for t in TARGETS}
    assert {"istos.Istos", "istos.JobNotFound", "istos_nb.attach", "Istos.enqueue",
            "Istos.serving", "LiveQueue.ajob", "JobContext.progress", "SyncProducer.enqueue",
            "Simulation.run", "SimResult.check", "Trace.load", "SimResult"} <= labels
    assert len(TARGETS) > 150


def test_a_missing_or_short_docstring_fails_the_gate():
    def bare() -> None:
        raise ValueError("x")

    def short() -> None:
        """Does it."""

    def silent() -> None:
        """Does the thing, and says nothing about the error it throws."""
        raise ValueError("x")

    assert _own_doc(bare) == "" and not _is_sentence(_own_doc(short))
    assert _raises_itself(silent) and "raise" not in _own_doc(silent).lower()


# -- the error tree --------------------------------------------------------------------------
TREE_LINE = re.compile(r"^(?P<indent>(?:[│ ] {3})*)(?:├── |└── )(?P<name>\w+)"
                       r"(?: \(also (?P<also>\w+)\))?")


def drawn_tree() -> dict[str, tuple[str, str | None]]:
    """name -> (parent drawn, builtin named in "(also X)") from errors.py's docstring."""
    doc = istos.errors.__doc__ or ""
    block = doc[doc.index("The tree::"):]
    lines = [line[4:] for line in block.splitlines()[2:] if line.startswith("    ")]
    assert lines[0] == "IstosError"
    tree: dict[str, tuple[str, str | None]] = {}
    stack = ["IstosError"]
    for line in lines[1:]:
        m = TREE_LINE.match(line)
        assert m, f"not a tree line: {line!r}"
        depth = len(m["indent"]) // 4 + 1
        del stack[depth:]
        assert m["name"] not in tree, f"{m['name']} is drawn twice"
        tree[m["name"]] = (stack[-1], m["also"])
        stack.append(m["name"])
    return tree


def defined_errors() -> dict[str, type[BaseException]]:
    """Every exception class defined in a module of istos or istos_nb, by name."""
    found: dict[str, type[BaseException]] = {}
    for package in (istos, istos_nb):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            module = importlib.import_module(info.name)
            for obj in vars(module).values():
                if inspect.isclass(obj) and issubclass(obj, BaseException) \
                        and obj.__module__ == module.__name__:
                    assert found.get(obj.__name__, obj) is obj, f"two {obj.__name__} classes"
                    found[obj.__name__] = obj
    return found


def exported_errors() -> dict[str, type[BaseException]]:
    out = {}
    for module in (istos, istos_nb, istos_nb.sim):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                out[name] = obj
    return out


def test_every_exported_error_derives_from_istos_error():
    exported = exported_errors()
    assert {"IstosError", "ConfigError", "JobNotFound", "InvariantViolation",
            "ScenarioError", "TraceFormatError"} <= set(exported)
    for name, cls in exported.items():
        if name not in NOT_ISTOS:
            assert issubclass(cls, istos.IstosError), name
    assert issubclass(istos.JobNotFound, LookupError)
    assert issubclass(istos_nb.sim.InvariantViolation, AssertionError)


def test_the_tree_in_errors_py_is_the_real_hierarchy():
    tree, defined = drawn_tree(), defined_errors()
    ours = {name for name, cls in defined.items() if issubclass(cls, istos.IstosError)}
    assert set(exported_errors()) - set(NOT_ISTOS) <= set(tree) | {"IstosError"}
    assert ours - {"IstosError"} == set(tree), "the tree must draw every IstosError subclass"
    assert set(defined) - ours == set(NOT_ISTOS), "an error class outside the IstosError tree"
    for name, (parent, also) in tree.items():
        cls = defined[name]
        assert defined[parent] in cls.__bases__, f"{name} is drawn under {parent}"
        if also is not None:
            assert issubclass(cls, getattr(builtins, also)), f"{name} is no {also}"
        builtin_bases = [b.__name__ for b in cls.__bases__ if b.__module__ == "builtins"]
        assert builtin_bases == ([also] if also else []), \
            f"{name} derives from {builtin_bases}: the tree must say so"
