"""Sphinx directives that generate reference pages from the code, so they cannot drift from it.

``.. istos-api:: MODULE``
    One autodoc entry per name in ``MODULE.__all__``, in its order: classes with their public
    members, exceptions, functions, data. A name added to ``__all__`` appears without an edit.

``.. istos-options:: MODULE:CALLABLE``
    A table of the callable's keyword options: name, default (read from its signature) and the
    description given in the directive's body as ``name: text`` lines (a line starting with
    spaces continues the previous one). An option of the signature without a description, or
    a description of an option the signature lacks, is a warning (an error under ``-W``).

``%optional-pages%`` (a line in a toctree of a section's ``index.md``)
    Replaced, before the page is parsed, by every top-level page of ``docs/`` that no section
    lists yet (``contributing`` goes to the project section, ``architecture-*`` to the
    explanations, any other to the how-to guides):
    pages added beside ``index.md`` join a section without an edit here, and a section whose
    optional page does not exist yet builds without a warning.

``.. istos-error-tree:: MODULE [MODULE ...]``
    The subclass tree of every exception the modules export, each with its docstring's first
    sentence; a class that is a ``ValueError`` or ``LookupError`` too says so.
"""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive, directives
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util import logging

LOG = logging.getLogger(__name__)


def _resolve(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


class _Generated(Directive):
    """A directive whose output is reStructuredText parsed in place."""

    def emit(self, lines: list[str]) -> list[nodes.Node]:
        source = self.state_machine.get_source_and_line(self.lineno)[0]
        holder = nodes.section()
        holder.document = self.state.document
        self.state.nested_parse(StringList(lines, source=source), self.content_offset, holder,
                                match_titles=True)
        return holder.children


class ApiDirective(_Generated):
    required_arguments = 1
    has_content = False
    option_spec = {"skip": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        module_name = self.arguments[0]
        module = importlib.import_module(module_name)
        skip = set((self.options.get("skip") or "").split())
        lines: list[str] = []
        for name in module.__all__:
            if name in skip:
                continue
            obj = getattr(module, name)
            target = f"{module_name}.{name}"
            if isinstance(obj, type) and issubclass(obj, BaseException):
                lines += [f".. autoexception:: {target}", "   :show-inheritance:", ""]
            elif isinstance(obj, type):
                lines += [f".. autoclass:: {target}", "   :members:", ""]
            elif callable(obj):
                lines += [f".. autofunction:: {target}", ""]
            else:  # constants: their own docstring would be their type's (dict, tuple...)
                lines += [f".. py:data:: {target}", f"   :type: {type(obj).__name__}", ""]
                if isinstance(obj, dict):
                    keys = ", ".join(f"``{k}``" for k in obj)
                    lines += [f"   Keys: {keys}.", ""]
        return self.emit(lines)


def _options_described(content: list[str]) -> dict[str, str]:
    described: dict[str, str] = {}
    last = None
    for line in content:
        if not line.strip():
            continue
        if line[:1].isspace() and last is not None:
            described[last] += " " + line.strip()
            continue
        name, sep, text = line.partition(":")
        last = name.strip()
        described[last] = text.strip() if sep else ""
    return described


def _default(param: inspect.Parameter) -> str:
    if param.default is inspect.Parameter.empty:
        return "required"
    return f"``{param.default!r}``"


class OptionsDirective(_Generated):
    required_arguments = 1
    has_content = True
    option_spec = {"skip": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        spec = self.arguments[0]
        signature = inspect.signature(_resolve(spec))
        skip = set((self.options.get("skip") or "").split()) | {"self", "cls"}
        params = [p for p in signature.parameters.values() if p.name not in skip
                  and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        described = _options_described(list(self.content))
        where = self.state_machine.get_source_and_line(self.lineno)
        for p in params:
            if not described.get(p.name):
                LOG.warning("istos-options %s: option %r is not described", spec, p.name,
                            location=where)
        for name in set(described) - {p.name for p in params}:
            LOG.warning("istos-options %s: describes %r, which it does not take", spec, name,
                        location=where)
        lines = [".. list-table::", "   :header-rows: 1", "   :widths: 20 15 65", "",
                 "   * - option", "     - default", "     - meaning"]
        for p in params:
            lines += [f"   * - ``{p.name}``", f"     - {_default(p)}",
                      f"     - {described.get(p.name, '')}"]
        return self.emit(lines + [""])


def _first_sentence(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    para = " ".join(doc.split("\n\n")[0].split())
    end = para.find(". ")
    return para if end < 0 else para[:end + 1]


class ErrorTreeDirective(_Generated):
    required_arguments = 1
    optional_arguments = 8
    has_content = False

    def run(self) -> list[nodes.Node]:
        exported: dict[type, str] = {}
        for module_name in self.arguments:
            module = importlib.import_module(module_name)
            for name in getattr(module, "__all__", []):
                obj = getattr(module, name)
                if isinstance(obj, type) and issubclass(obj, BaseException):
                    exported.setdefault(obj, f"{module_name}.{name}")
        lines: list[str] = []

        def walk(cls: type, depth: int) -> None:
            children = [c for c in exported if cls in c.__bases__]
            also = [b.__name__ for b in cls.__bases__
                    if b not in exported and b.__module__ == "builtins" and b is not Exception]
            extra = f" (also ``{'``, ``'.join(also)}``)" if also else ""
            lines.append(f"{'  ' * depth}- :py:exc:`{exported[cls]}`{extra}: "
                         f"{_first_sentence(cls)}")
            lines.append("")
            for child in children:
                walk(child, depth + 1)

        roots = [c for c in exported if not any(b in exported for b in c.__bases__)]
        for root in roots:
            walk(root, 0)
        return self.emit(lines)


OPTIONAL_MARK = "%optional-pages%"
TOP_LEVEL_LISTED = {"index", "protocol", "notebooks"}  # top-level pages a section names

def _section_of(page: str) -> str:
    """Where a top-level page joins: the project's pages, explanations, or a how-to guide."""
    if page in ("contributing", "changelog"):
        return "project"
    if page.startswith("architecture"):
        return "explanation"
    return "howto"


def _optional_pages(app: Sphinx, docname: str, source: list[str]) -> None:
    if OPTIONAL_MARK not in source[0]:
        return
    top = sorted(p.stem for p in Path(app.srcdir).glob("*.md")
                 if p.stem not in TOP_LEVEL_LISTED)
    wanted = [n for n in top if _section_of(n) == docname.split("/")[0]]
    source[0] = source[0].replace(OPTIONAL_MARK, "\n".join(f"../{n}" for n in wanted))


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("source-read", _optional_pages)
    app.add_directive("istos-api", ApiDirective)
    app.add_directive("istos-options", OptionsDirective)
    app.add_directive("istos-error-tree", ErrorTreeDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
