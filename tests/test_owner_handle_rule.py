"""Extensions reach the owner only through its named registrations (``owner/handle.py``).

An AST scan of ``istos/owner/`` and ``istos/features/``: no module but the owner's own assigns
an attribute of an ``owner`` object (``owner.x = ...``, ``self.owner.state.x = ...``) or calls
a mutating method on one of its collections (``owner.nudges.absorbers.append(...)``). Such a
reach-in is how a hidden coupling starts; the handle offers a named registration instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "istos"
SCANNED = ("owner", "features")
OWNERS_OWN = {ROOT / "owner" / "owner.py"}  # the owner sets its own attributes (as ``self``)
MUTATORS = frozenset({"append", "add", "extend", "insert", "update", "setdefault", "remove",
                      "discard", "pop", "clear"})


def _rooted_at_owner(node: ast.expr) -> bool:
    """Whether ``node`` is ``owner`` / ``self.owner`` / ``<x>.owner`` or an attribute chain
    starting there (``owner.state.paused``)."""
    while isinstance(node, ast.Attribute):
        if node.attr == "owner":
            return True
        node = node.value
    return isinstance(node, ast.Name) and node.id in ("owner", "qowner", "queue_owner")


def reach_ins(tree: ast.AST) -> list[tuple[int, str]]:
    """Every owner attribute assigned and owner collection mutated in ``tree``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and isinstance(part.ctx, ast.Store) \
                        and _rooted_at_owner(part.value):
                    found.append((node.lineno, f"assigns {ast.unparse(part)}"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in MUTATORS and isinstance(node.func.value, ast.Attribute) \
                and _rooted_at_owner(node.func.value.value):
            found.append((node.lineno, f"calls {ast.unparse(node.func)}"))
    return found


def test_no_extension_assigns_an_owner_attribute_or_fills_its_collections() -> None:
    offences = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).glob("*.py")):
            if path in OWNERS_OWN:
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            offences += [f"{path.relative_to(ROOT.parent)}:{line}: {what}"
                         for line, what in reach_ins(tree)]
    assert offences == [], "use the owner handle's registrations:\n" + "\n".join(offences)


def test_the_scan_sees_each_kind_of_reach_in() -> None:
    """The rule would catch what it forbids (so a pass above means something)."""
    source = (
        "owner.meta_check = f\n"
        "self.owner.state.paused = True\n"
        "owner.lease_until += 1\n"
        "owner.nudges.absorbers.append(f)\n"
        "self.owner.hungry.add(x)\n"
    )
    kinds = [what for _, what in reach_ins(ast.parse(source))]
    assert kinds == ["assigns owner.meta_check", "assigns self.owner.state.paused",
                         "assigns owner.lease_until", "calls owner.nudges.absorbers.append",
                         "calls self.owner.hungry.add"]
    # Reading the owner, or assigning a local, is fine.
    assert reach_ins(ast.parse("x = owner.state.paused\nself.owner = owner\n")) == []


def private_state_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """Every ``_``-member of a queue state (``state._x``, ``owner.state._x``) used in ``tree``."""
    return [(node.lineno, ast.unparse(node)) for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and ((isinstance(node.value, ast.Name) and node.value.id == "state")
                 or (isinstance(node.value, ast.Attribute) and node.value.attr == "state"))]


def test_no_feature_or_extension_uses_the_queue_states_private_members() -> None:
    """The queue state's transitions are its public methods (``core/state.py``); a copy of one
    that calls ``state._forget`` drifts from the original the day it changes."""
    offences = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).glob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            offences += [f"{path.relative_to(ROOT.parent)}:{line}: {what}"
                         for line, what in private_state_uses(tree)]
    assert offences == []
    assert private_state_uses(ast.parse("state._forget(rec)\nowner.state._save(r)\n")) == [
        (1, "state._forget"), (2, "owner.state._save")]
