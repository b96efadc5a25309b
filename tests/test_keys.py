"""Exactly one module spells a queue's key expressions (``istos/keys.py``): owners serve on,
and every client sends to, keys built there; a second f-string of the format could drift."""

from __future__ import annotations

import ast
from pathlib import Path

from istos import keys, protocol

ROOT = Path(__file__).resolve().parent.parent
THE_ONE = "istos/keys.py"


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the constants that are docstrings (a bare string statement)."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}


def _key_spellings(source: str) -> list[int]:
    """Lines that spell a queue key: a string (or an f-string's literal part) holding
    ``/q/``, or the literal ``"rpc"`` handed to a call (``node.key(queue, "rpc")``)."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docs and "/q/" in node.value:
            hits.append(node.lineno)
        elif isinstance(node, ast.Call):
            args = [*node.args, *(k.value for k in node.keywords)]
            if any(isinstance(a, ast.Constant) and a.value == "rpc" for a in args):
                hits.append(node.lineno)
    return sorted(set(hits))


def test_exactly_one_module_spells_the_queue_keys() -> None:
    spelled = {}
    for package in ("istos", "istos_nb"):
        for path in sorted((ROOT / package).rglob("*.py")):
            lines = _key_spellings(path.read_text())
            if lines:
                spelled[str(path.relative_to(ROOT))] = lines
    assert list(spelled) == [THE_ONE], spelled


def test_the_scan_sees_an_f_string_key_and_a_leaf_literal() -> None:
    assert _key_spellings('key = f"{prefix}/q/{queue}/rpc/read"\n') == [1]
    assert _key_spellings('k = node.key(queue, "rpc")\n') == [1]
    assert _key_spellings('"""A docstring naming {prefix}/q/{queue}/rpc."""\n') == []


def test_the_keys_have_the_documented_shape() -> None:
    assert keys.rpc_base("istos", "jobs/email") == "istos/q/jobs/email/rpc"
    for op, role in protocol.OP_ROLES.items():
        assert keys.rpc_key("p", "q", op) == f"p/q/q/rpc/{role}"
    assert keys.rpc_key("p", "q", "an_extension_op") == "p/q/q/rpc/admin"  # the narrowest
    assert keys.events_key("p", "a/b") == "p/q/a/b/events"
    assert keys.worker_token_key("p", "q") == "p/q/q/workers/**"
    assert keys.worker_token_key("p", "q", "n1") == "p/q/q/workers/n1"
