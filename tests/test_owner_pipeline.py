"""The owner pipeline: its order is data, and the chain serving ``claim`` follows it."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import count, wait_events

from istos import ConfigError, Istos
from istos.owner.composition import OWNER_PIPELINE, compose
from istos.owner.extension import Handler, Hooks, OwnerExtension
from istos.owner.owner import QueueOwner
from istos.transport.local import LocalMesh

PINNED = ("schedules", "workflows", "batches", "inspect", "lookup", "series", "leases", "workers",
          "bulk_admin", "latency", "workflow_view", "announce", "local_nudge", "parking", "deps")


def test_the_pipeline_order_is_pinned() -> None:
    """A change of order changes which wrapper sees a request first: make it on purpose."""
    assert OWNER_PIPELINE == PINNED


async def test_an_owner_serves_through_the_declared_pipeline(monkeypatch) -> None:
    calls: list[str] = []
    installed = QueueOwner.extend

    def recording_extend(self: QueueOwner, ext: OwnerExtension, *, first: bool = False) -> None:
        if "claim" in ext.wraps:
            declared_wrap = ext.wrap

            def wrap(op: str, inner: Handler) -> Handler:
                if op == "claim" and not calls_wrapped:
                    inner = _recorded("owner", inner, calls)  # the owner's own claim
                calls_wrapped.append(ext.name)
                made = declared_wrap(op, inner)
                return _recorded(ext.name, made, calls) if op == "claim" else made

            monkeypatch.setattr(ext, "wrap", wrap)
        installed(self, ext, first=first)

    calls_wrapped: list[str] = []
    monkeypatch.setattr(QueueOwner, "extend", recording_extend)
    mesh = LocalMesh()
    owner, worker = Istos(transport=mesh.transport("o")), Istos(transport=mesh.transport("w"))
    owner.queue("q")

    @worker.worker("q")
    async def run(job: Any) -> None:
        return None

    async with owner.serving(), worker.serving():
        qowner = owner.owners["q"]
        assert [ext.name for ext in qowner.extensions] == list(OWNER_PIPELINE)
        jid = await owner.enqueue("q", {"n": 1})
        await wait_events(owner, lambda evs: count(evs, "acked", jid) == 1)
    wrappers = [name for name in reversed(OWNER_PIPELINE)
                if "claim" in _declared_wraps(name, qowner)]
    assert wrappers == ["parking", "workers", "leases"]
    # A claim enters at the outermost wrapper and reaches the owner's own claim last.
    assert calls[:4] == [*wrappers, "owner"]


def _declared_wraps(name: str, qowner: QueueOwner) -> tuple[str, ...]:
    return next(ext.wraps for ext in qowner.extensions if ext.name == name)


def _recorded(name: str, handler: Handler, calls: list[str]) -> Handler:
    async def recorded(msg: dict[str, Any]) -> dict[str, Any]:
        calls.append(name)
        return await handler(msg)
    return recorded


class _WrapsNothingServed(OwnerExtension):
    name = "stray"
    wraps = ("no_such_op",)


class _ServesWhatItDoesNotDeclare(OwnerExtension):
    name = "stray"

    def ops(self) -> dict[str, Handler]:
        return {"ping": _recorded("x", _never, [])}


async def _never(msg: dict[str, Any]) -> dict[str, Any]:
    raise AssertionError("not called")


async def test_a_pipeline_that_does_not_add_up_is_refused() -> None:
    app = Istos(transport=LocalMesh().transport("o"))
    app.queue("q")
    async with app.serving():
        qowner = app.owners["q"]
        with pytest.raises(ConfigError, match="wraps 'no_such_op'"):
            qowner.extend(_WrapsNothingServed())
        with pytest.raises(ConfigError, match="declares it serves"):
            qowner.extend(_ServesWhatItDoesNotDeclare())
        with pytest.raises(ConfigError, match="not in the owner pipeline"):
            compose(qowner, [Hooks(name="stray")])
        with pytest.raises(ConfigError, match="misses"):
            compose(qowner, [Hooks(name="local_nudge")])
        # Serving an op served before, without declaring the wrap, is refused by name.
        same = [Hooks(name=name) for name in OWNER_PIPELINE if name != "inspect"]
        with pytest.raises(ConfigError, match="served before it"):
            compose(qowner, [*same, Hooks(name="inspect", ops={"stats": _never})])
