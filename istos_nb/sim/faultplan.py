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
               "storage_outage", "clock_skew", "clock_drift")
# Kinds drawn with a length (for ``clock_skew``: how far the clock steps ahead) and with ``p``.
WINDOWED = {"crash", "freeze", "partition", "lost_acks", "message_loss", "storage_outage",
            "clock_skew", "clock_drift"}
WITH_P = {"message_loss", "clock_drift"}

Build = Callable[[Simulation], Any]


@dataclass(frozen=True)
class Fault:
    """One fault of a schedule: ``kind`` (see :data:`FAULT_KINDS`) on ``node`` (empty for a
    storage outage) from virtual time ``at`` for ``duration`` seconds (a crashed node restarts
    after it; a restart has none), ``p`` the loss probability of a ``message_loss`` window.
    A ``clock_skew`` steps the node's wall clock ``duration`` seconds ahead at ``at`` (for
    good); a ``clock_drift`` makes its clock run ``p`` (a fraction: 0.5 is 50%) fast for
    ``duration`` seconds, then at its former rate (the clock of the node's live process).
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
        elif self.kind == "clock_skew":
            sim.world.node(self.node)
            sim.at(self.at, _step_clock, sim, self.node, self.duration)
        elif self.kind == "clock_drift":
            _drift_window(sim, self.node, self.at, self.end, 1.0 + self.p)
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
            "clock_skew": (f"{n}'s clock jumps {self.duration:.1f} s ahead", None),
            "clock_drift": (f"{n}'s clock runs {self.p:.0%} fast", f"{n}'s clock runs at "
                            "its usual rate again"),
        }[self.kind]


def _step_clock(sim: Simulation, node: str, seconds: float) -> None:
    clock = sim.nodes[node].clock
    if clock is not None and sim.nodes[node].alive:
        clock.step(seconds)
        sim.world.node_event(node, "clock_stepped", seconds=seconds)


def _drift_window(sim: Simulation, node: str, start: float, end: float, rate: float) -> None:
    sim.world.node(node)
    saved: dict[str, float] = {}

    def begin() -> None:
        clock = sim.nodes[node].clock
        if clock is not None and sim.nodes[node].alive:
            saved["rate"] = clock.rate
            clock.set_rate(rate)
            sim.world.node_event(node, "clock_drifting", rate=rate)

    def finish() -> None:
        clock = sim.nodes[node].clock
        if clock is not None and "rate" in saved:
            clock.set_rate(saved["rate"])
            sim.world.node_event(node, "clock_drift_over")

    sim.at(start, begin)
    sim.at(end, finish)


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
