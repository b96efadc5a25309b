"""A fault schedule: the faults :func:`~istos_nb.sim.explore.explore` draws, and one run of it.

A :class:`Fault` is a kind, a node, a start and a length; :func:`run_schedule` builds a
scenario, schedules the faults on it and runs it, the same way every time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import ScenarioError
from .result import SimResult
from .simulation import Simulation

__all__ = ["Fault", "FAULT_KINDS", "WINDOWED", "run_schedule", "Build"]

#: Every fault kind the search can draw, simplest first (the shrinker prefers earlier ones).
FAULT_KINDS = ("crash", "restart", "freeze", "partition", "lost_acks", "message_loss",
               "storage_outage")
WINDOWED = {"crash", "freeze", "partition", "lost_acks", "message_loss", "storage_outage"}

Build = Callable[[Simulation], Any]


@dataclass(frozen=True)
class Fault:
    """One fault of a schedule: ``kind`` (see :data:`FAULT_KINDS`) on ``node`` (empty for a
    storage outage) from virtual time ``at`` for ``duration`` seconds (a crashed node restarts
    after it; a restart has none), ``p`` the loss probability of a ``message_loss`` window.
    Its ``repr`` is valid Python, so a generated test can carry a schedule verbatim."""

    kind: str
    node: str
    at: float
    duration: float = 0.0
    p: float = 0.0

    @property
    def end(self) -> float:
        """When the fault is over (``at`` for a restart)."""
        return self.at + self.duration

    def apply(self, sim: Simulation) -> None:
        """Schedule this fault on ``sim``; raises :class:`ScenarioError` for an unknown kind
        or one the scenario cannot take (a storage outage on volatile storage)."""
        if self.kind == "crash":
            sim.crash(self.node, at=self.at, restart_after=self.duration)
        elif self.kind == "restart":
            sim.restart(self.node, at=self.at)
        elif self.kind == "freeze":
            sim.freeze(self.node, at=self.at, resume_at=self.end)
        elif self.kind == "partition":
            others = set(sim.nodes) - {self.node}
            if others:
                sim.partition({self.node}, others, at=self.at, heal_at=self.end)
        elif self.kind == "lost_acks":
            _lost_acks_window(sim, self.node, self.at, self.end)
        elif self.kind == "message_loss":
            before = sim.net.loss
            sim.network(loss=self.p, at=self.at)
            sim.network(loss=before, at=self.end)
        elif self.kind == "storage_outage":
            sim.storage_outage(at=self.at, until=self.end)
        else:
            raise ScenarioError(f"unknown fault kind {self.kind!r}; kinds: {FAULT_KINDS}")

    def describe(self) -> tuple[str, str | None]:
        """What a person reads: the line at its start and the line at its end (or None)."""
        n, until = self.node, f"{self.end:.1f}"
        return {
            "crash": (f"{n} crashes (memory lost, no ack)", f"{n} restarts"),
            "restart": (f"{n} restarts (a crash and straight back)", None),
            "freeze": (f"{n} freezes (as SIGSTOP: nothing of it runs)", f"{n} resumes"),
            "partition": (f"{n} is cut off from every other node", f"the cut around {n} heals"),
            "lost_acks": (f"every ack {n}'s workers send from now is lost (until t={until})",
                          f"{n}'s acks arrive again"),
            "message_loss": (f"the network drops {self.p:.0%} of messages",
                             "the network stops dropping messages"),
            "storage_outage": ("the storage refuses every call", "the storage is back"),
        }[self.kind]


def _lost_acks_window(sim: Simulation, node: str, start: float, end: float) -> None:
    sim.world.node(node)
    lose = sim.world.lose_ack
    saved: dict[str, float | None] = {}

    def begin() -> None:
        saved["p"] = lose.get(node)
        lose[node] = 1.0

    def finish() -> None:
        p = saved.get("p")
        if p is None:
            lose.pop(node, None)
        else:
            lose[node] = p

    sim.at(start, begin)
    sim.at(end, finish)


def run_schedule(build: Build, schedule: Sequence[Fault], *, seed: int = 0,
                 until: float = 60.0, options: Mapping[str, Any] | None = None) -> SimResult:
    """One run: ``Simulation(seed, **options)``, ``build(sim)``, the ``schedule``'s faults, run
    to ``until``. The same arguments give the same run. Raises what they raise
    (:class:`ScenarioError` for an impossible scenario)."""
    sim = Simulation(seed, **dict(options or {}))
    build(sim)
    for fault in schedule:
        fault.apply(sim)
    return sim.run(until, progress=None)
