"""Seams of the engine read from the source (AST), so they keep holding:

- no module but ``istos/core/state.py`` touches a ``_``-prefixed member of the queue state:
  features change it through its public, documented methods;
- no owner-side module writes storage but through the write path
  (``owner/persistence/write_path.py``, whose job writes go through
  ``owner/persistence/persist.py``): a write there carries an HA leader's fence;
- nothing awaits with a deadline but through ``istos.cancel_guard.within``: on Python 3.11,
  ``asyncio.wait_for`` swallows a cancel that lands as what it awaits ends (a stop that
  cancels a loop and awaits it then waits forever), and ``within`` does not.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "istos"

STATE_NAMES = frozenset({"state", "queue_state", "qstate"})
"""Names a :class:`~istos.core.state.QueueState` goes by in the engine (``state``,
``self.state``, ``owner.state``, ...)."""

STORAGE_WRITES = frozenset({"put", "put_many", "delete", "apply", "put_if_absent"})

NOT_OWNER_STATE = {
    # Written by nodes that are not a queue's owner, for records no leadership guards.
    "istos/features/pubsub.py": "a subscriber's cursor: one node's own progress, not a queue's",
    "istos/features/ledger.py": "the worker-side idempotency ledger (put_if_absent claims)",
    "istos/features/evhistory.py": "event history: append-only by put_if_absent sequence, "
                                   "shared by every publisher, not queue state",
    "istos/owner/persistence/persist.py": "the write path's job writer (fenced: Persister.fence)",
}
"""Modules under istos/owner and istos/features that may call a storage write, and why."""


def modules(root: Path) -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        yield rel, ast.parse(path.read_text(), rel)


def names_state(node: ast.expr) -> bool:
    """``state``, ``queue_state``, or ``<anything>.state`` (``self.state``, ``owner.state``)."""
    if isinstance(node, ast.Name):
        return node.id in STATE_NAMES
    return isinstance(node, ast.Attribute) and node.attr in STATE_NAMES


def private(attr: str) -> bool:
    return attr.startswith("_") and not (attr.startswith("__") and attr.endswith("__"))


def test_no_module_but_the_state_touches_its_private_members() -> None:
    found = [f"{rel}:{node.lineno}: {ast.unparse(node)}"
             for rel, tree in modules(ENGINE) if rel != "istos/core/state.py"
             for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and private(node.attr)
             and names_state(node.value)]
    assert not found, "a module reaches into QueueState's private members; give the state " \
                      "a public method for it:\n" + "\n".join(found)


def test_the_rule_sees_a_reach_in() -> None:
    """The check above finds what it forbids (else it proves nothing)."""
    tree = ast.parse("def f(owner, state):\n    owner.state._save(1)\n    state._move(2)\n"
                     "    self.state.__class__\n    other._x\n")
    hits = [ast.unparse(n) for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and private(n.attr) and names_state(n.value)]
    assert sorted(hits) == ["owner.state._save", "state._move"]


def storage_writes(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Calls ``<x>.storage.<write>(...)`` / ``<x>._storage.<write>(...)`` / ``storage.<write>``."""
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in STORAGE_WRITES:
            continue
        target = node.func.value
        name = target.attr if isinstance(target, ast.Attribute) else \
            target.id if isinstance(target, ast.Name) else ""
        if name in ("storage", "_storage", "store"):
            yield node.lineno, ast.unparse(node.func)


def test_owner_side_storage_writes_go_through_the_write_path() -> None:
    found = [f"{rel}:{line}: {call}"
             for root in (ENGINE / "owner", ENGINE / "features")
             for rel, tree in modules(root) if rel not in NOT_OWNER_STATE
             for line, call in storage_writes(tree)]
    assert not found, "an owner-side storage write outside the write path (use " \
                      "owner.writes.apply_aux / put_aux / delete_aux):\n" + "\n".join(found)


def test_the_storage_rule_sees_a_direct_write() -> None:
    tree = ast.parse("async def f(self, storage):\n"
                     "    await self.owner.storage.put(1, 2, 3)\n"
                     "    await storage.delete(1, 2)\n"
                     "    await self.owner.writes.put_aux(1, 2, 3)\n"
                     "    await self.owner.storage.get(1, 2)\n")
    assert [call for _, call in storage_writes(tree)] == ["self.owner.storage.put",
                                                          "storage.delete"]


def test_every_read_op_but_the_event_ones_is_fenced() -> None:
    """The owner fences every op of the ``read`` role (``QueueOwner.dispatch``) but these;
    each of them is a read op, so none is a write let through unfenced by a typo."""
    from istos import protocol
    from istos.owner.persistence.write_path import UNFENCED_READS

    reads = {op for op in protocol.OP_ROLES if protocol.role_of(op) == "read"}
    assert UNFENCED_READS <= reads
    assert {"result", "why", "stats", "jobs", "dead", "states", "resolve", "batch_status",
            "chord_expects", "series", "logs", "leases", "workers"} <= reads - UNFENCED_READS


DEADLINE_HELPER = ("istos/cancel_guard.py", "within")
"""The one place that may call ``asyncio.wait_for`` (on Python 3.10, outside a Task, or for
a deadline of 0), and the function it sits in."""


def wait_for_uses(tree: ast.Module) -> Iterator[tuple[ast.AST, str]]:
    """Each ``asyncio.wait_for`` (called or not) and each ``from asyncio... import wait_for``,
    with the name of the function it sits in ("" at module level)."""
    def walk(node: ast.AST, func: str) -> Iterator[tuple[ast.AST, str]]:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                else func
            if isinstance(child, ast.Attribute) and child.attr == "wait_for" \
                    and isinstance(child.value, ast.Name) and child.value.id == "asyncio":
                yield child, func
            elif isinstance(child, ast.ImportFrom) and (child.module or "").startswith("asyncio") \
                    and any(alias.name == "wait_for" for alias in child.names):
                yield child, func
            yield from walk(child, inner)
    return walk(tree, "")


def test_deadlines_go_through_the_one_helper() -> None:
    uses = [(rel, func, f"{rel}:{node.lineno}: {ast.unparse(node)}")
            for rel, tree in modules(ENGINE) for node, func in wait_for_uses(tree)]
    found = [where for rel, func, where in uses if (rel, func) != DEADLINE_HELPER]
    assert not found, "asyncio.wait_for outside istos.cancel_guard.within (it swallows a " \
                      "cancel on Python 3.11; use `await within(aw, timeout_s)`):\n" \
                      + "\n".join(found)
    assert any((rel, func) == DEADLINE_HELPER for rel, func, _ in uses), \
        "the helper moved: update DEADLINE_HELPER"


def test_the_deadline_rule_sees_a_wait_for() -> None:
    tree = ast.parse("import asyncio\n"
                     "from asyncio import wait_for\n"
                     "async def f(cond):\n"
                     "    await asyncio.wait_for(g(), 1)\n"
                     "    await cond.wait_for(ready)\n"  # a Condition's: no deadline
                     "    bound = asyncio.wait_for\n"
                     "async def within(aw, t):\n"
                     "    return await asyncio.wait_for(aw, t)\n")
    assert [(ast.unparse(n), func) for n, func in wait_for_uses(tree)] == [
        ("from asyncio import wait_for", ""), ("asyncio.wait_for", "f"),
        ("asyncio.wait_for", "f"), ("asyncio.wait_for", "within")]
