"""Freezing a simulated node (SIGSTOP-like) and resuming it.

A frozen node runs nothing: the virtual loop's gate (:func:`frozen_parking`) parks every callback
of its incarnation as it comes due (its timers, the messages delivered to it, its tasks' steps),
in order. Its peers still see its sessions and liveliness tokens, as they would a stopped
process, until the World's ``link_lease_s`` later, when the mesh cuts its links (Zenoh's link
lease). On resume the parked callbacks run first, late, and its links come back. Its clock kept
running meanwhile, as a real process's wall clock does.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

from .simnode import current_incarnation

if TYPE_CHECKING:
    from .world import World


def frozen_parking() -> list[tuple[Any, tuple[Any, ...], contextvars.Context]] | None:
    """The virtual loop's gate: a frozen incarnation's callbacks are parked, in order."""
    life = current_incarnation.get()
    return life.parked if life is not None and life.frozen else None


def freeze(world: World, name: str) -> None:
    """Freeze ``name`` now (nothing if it is down or frozen already)."""
    life = world.nodes[name].incarnation
    if life is None or life.frozen:
        return
    loop = world.loop
    assert loop is not None
    life.frozen = True
    world.node_event(name, "frozen")

    def lease_ran_out() -> None:
        if life.frozen and not life.link_cut:
            life.link_cut = True
            world.cut_links(name, True)

    # In an empty context: this timer belongs to the mesh, not to the frozen node.
    loop.call_later(world.link_lease_s, lease_ran_out, context=contextvars.Context())


def resume(world: World, name: str) -> None:
    """Resume ``name`` (nothing if it is not frozen): its parked callbacks first."""
    life = world.nodes[name].incarnation
    if life is None or not life.frozen:
        return
    loop = world.loop
    assert loop is not None
    life.frozen = False
    world.node_event(name, "resumed")
    if life.link_cut:
        life.link_cut = False
        world.cut_links(name, False)
    parked, life.parked = life.parked, []
    for callback, args, context in parked:  # in the order they came due
        context.run(loop.call_soon, callback, *args)
