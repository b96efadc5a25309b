"""Freezing a simulated node (SIGSTOP-like) and resuming it.

A frozen node runs nothing: the virtual loop's gate (:func:`frozen_parking`) parks every callback
of its incarnation as it comes due (its timers, the messages delivered to it, its tasks' steps),
in order. Its peers still see its sessions and liveliness tokens, as they would a stopped
process, until ``Simulation.link_lease_s`` later, when the mesh cuts its links (Zenoh's link
lease). On resume the parked callbacks run first, late, and its links come back. Its clock kept
running meanwhile, as a real process's wall clock does.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

from .simnode import current_incarnation

if TYPE_CHECKING:
    from .simulation import Simulation


def frozen_parking() -> list[tuple[Any, tuple[Any, ...], contextvars.Context]] | None:
    """The virtual loop's gate: a frozen incarnation's callbacks are parked, in order."""
    life = current_incarnation.get()
    return life.parked if life is not None and life.frozen else None


def freeze(sim: Simulation, name: str) -> None:
    life = sim.nodes[name].incarnation
    if life is None or life.frozen:
        return
    assert sim._loop is not None
    life.frozen = True
    sim._node_event(name, "frozen")

    def lease_ran_out() -> None:
        if life.frozen and not life.link_cut:
            life.link_cut = True
            cut_links(sim, name, True)

    # In an empty context: this timer belongs to the mesh, not to the frozen node.
    sim._loop.call_later(sim.link_lease_s, lease_ran_out, context=contextvars.Context())


def resume(sim: Simulation, name: str) -> None:
    life = sim.nodes[name].incarnation
    if life is None or not life.frozen:
        return
    assert sim._loop is not None
    life.frozen = False
    sim._node_event(name, "resumed")
    if life.link_cut:
        life.link_cut = False
        cut_links(sim, name, False)
    parked, life.parked = life.parked, []
    for callback, args, context in parked:  # in the order they came due
        context.run(sim._loop.call_soon, callback, *args)


def cut_links(sim: Simulation, name: str, cut: bool) -> None:
    """Partition ``name`` from every other node (or heal that), and tell the watchers."""
    others = set(sim.nodes) - {name}
    (sim.net.partition if cut else sim.net.heal)({name}, others)
    sim.mesh.refresh_liveliness()
