"""Explore: search fault schedules for a run that breaks a property, and shrink what it finds.

``explore(build, prop)`` asks the simulator the question the other way round: not "what happens
in this scenario?" but "is there a schedule of crashes, freezes, partitions, lost acks... under
which ``prop`` fails?". Hypothesis draws the schedules (a list of :class:`Fault`, each a kind, a
node, a start and a length in tenths of a second) and shrinks a failing one, so the schedule
handed back has as few faults as it could find, the shortest lengths, the earliest starts and
the simplest kinds (earlier in :data:`FAULT_KINDS`). Every schedule runs on the same seed, so a
schedule alone replays its run exactly (:func:`run_schedule`).

A search that finds nothing proves nothing: :class:`NoCounterexample` says how many schedules
it ran and what they covered.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .counterexample import Counterexample, Coverage, NoCounterexample, Property
from .errors import ScenarioError
from .faultplan import FAULT_KINDS, WINDOWED, WITH_P, Build, Fault, run_schedule
from .result import SimResult
from .simulation import Simulation

__all__ = ["explore", "find", "holds", "duplicated", "Fault", "FAULT_KINDS", "run_schedule",
           "Property", "Counterexample", "NoCounterexample", "Coverage"]

PropLike = str | Callable[[SimResult], bool] | Property


def find(predicate: Callable[[SimResult], bool], name: str | None = None) -> Property:
    """The property "no run where ``predicate(result)`` is True": explore finds a run where it
    is. ``name`` is what the story calls that run (default: the function's name)."""
    label = name or getattr(predicate, "__name__", "the predicate")
    return Property(f"a run where {label}", lambda r: not predicate(r))


def holds(predicate: Callable[[SimResult], bool], name: str | None = None) -> Property:
    """The property ``predicate(result)`` is True (explore looks for a run where it is not)."""
    return Property(name or str(getattr(predicate, "__name__", "the predicate")), predicate)


def duplicated() -> Property:
    """"Find a run where some job's handler completed more than once"."""
    return Property("a run where some job ran twice", lambda r: r.counts["duplicated"] == 0,
                    expr="result.counts['duplicated'] > 0")


def _property(prop: PropLike) -> Property:
    if isinstance(prop, Property):
        return prop
    if isinstance(prop, str):
        return Property.invariant_named(prop)
    if callable(prop):
        return holds(prop)
    raise ScenarioError(f"prop must be an invariant's name, a predicate or a Property, "
                        f"got {prop!r}")


def _strategy(nodes: Sequence[str], kinds: Sequence[str], until: float,
              max_faults: int) -> Any:
    from hypothesis import strategies as st

    ticks = max(int(until * 10) - 1, 1)  # tenths of a second: integers shrink to round times
    start_max, length_max = ticks * 3 // 5, ticks * 2 // 5

    @st.composite
    def number(draw: Any, low: int, high: int) -> int:
        # From coin flips, most significant first (so it shrinks towards ``low``), not from
        # st.integers: Hypothesis mixes constants found in the loaded modules' source into
        # integer draws, so the same seed would draw other schedules after another import.
        bits = max(high - low, 0).bit_length()
        value = 0
        for _ in range(bits):
            value = value * 2 + int(draw(st.booleans()))
        return low + min(value, high - low)

    @st.composite
    def fault(draw: Any) -> Fault:
        # Only the fields a kind uses are drawn, so the shrinker has nothing idle to try.
        kind = kinds[draw(number(0, len(kinds) - 1))]
        node = "" if kind == "storage_outage" else nodes[draw(number(0, len(nodes) - 1))]
        at = draw(number(0, start_max)) / 10
        length = draw(number(1, max(length_max, 1))) / 10 if kind in WINDOWED else 0.0
        p = draw(number(1, 9)) / 10 if kind in WITH_P else 0.0
        return Fault(kind, node, at, length, p)

    return st.lists(fault(), max_size=max_faults).map(tuple)


def explore(build: Build, prop: PropLike, *,  # noqa: PLR0913 (the search's knobs, by keyword)
            faults: Sequence[str] | None = None,
            budget: int = 200, seed: int = 0, until: float = 60.0, max_faults: int = 3,
            nodes: Sequence[str] | None = None,
            options: Mapping[str, Any] | None = None) -> Counterexample | NoCounterexample:
    """Search fault schedules for a run of ``build`` that breaks ``prop``; shrink the first.

    ``build(sim)`` declares nodes, queues, workers and a workload on a fresh
    ``Simulation(seed, **options)``; ``prop`` is an invariant's name (a row of
    ``SimResult.check()``), a predicate over the :class:`SimResult` that is True when the
    property holds, or a :class:`Property` (:func:`find` turns "a run where ..." into one).
    ``faults``: the kinds to draw (default every kind the scenario can take: a storage outage
    needs durable storage), at most ``max_faults`` per schedule, on ``nodes`` (default every
    node ``build`` declares), starting in the first 60% of the run, each lasting up to 40% of
    it. ``budget`` schedules are tried at most before the search gives up (shrinking a hit
    runs more); the search is deterministic given its arguments.

    Returns a :class:`Counterexample` (truthy) or a :class:`NoCounterexample` (falsy, with
    what the search covered). Raises :class:`ScenarioError` for an unknown fault kind or node,
    an impossible one, or an invariant name the checker does not have.
    """
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis import find as hypothesis_find
    from hypothesis.errors import NoSuchExample

    prop_ = _property(prop)
    options = dict(options or {})
    kinds = _kinds(faults, options)
    if budget < 1 or max_faults < 0:
        raise ScenarioError(f"budget must be >= 1 and max_faults >= 0, got {budget}, "
                            f"{max_faults}")
    probe = Simulation(seed, **options)
    build(probe)
    targets = list(nodes) if nodes is not None else list(probe.nodes)
    for name in targets:
        probe.world.node(name)  # ScenarioError for an unknown one
    if not targets:
        raise ScenarioError("build declared no node to put faults on")
    coverage = Coverage()
    # The fault-free run first, outside Hypothesis: a bad invariant name raises here, once.
    calm = probe.run(until, progress=None)
    coverage.add((), calm)
    if not prop_.check(calm):
        return Counterexample(schedule=(), prop=prop_, result=calm, build=build, seed=seed,
                              until=until, options=options, coverage=coverage)

    # The last breaking run, kept: Hypothesis runs the schedule it hands back last, and the
    # same schedule on the same seed replays the same run, so it need not run a third time.
    last_break: list[tuple[tuple[Fault, ...], SimResult]] = []

    def breaks(schedule: tuple[Fault, ...]) -> bool:
        result = run_schedule(build, schedule, seed=seed, until=until, options=options)
        coverage.add(schedule, result)
        broken = not prop_.check(result)
        if broken:
            last_break[:] = [(tuple(schedule), result)]
        return broken

    config = settings(max_examples=budget, database=None, deadline=None,
                      phases=[Phase.generate, Phase.shrink],
                      suppress_health_check=list(HealthCheck))
    try:
        schedule = hypothesis_find(_strategy(targets, kinds, until, max_faults), breaks,
                                   settings=config, random=random.Random(seed))
    except NoSuchExample:
        return NoCounterexample(prop_.name, coverage)
    if last_break and last_break[0][0] == tuple(schedule):
        result = last_break[0][1]
    else:
        result = run_schedule(build, schedule, seed=seed, until=until, options=options)
    return Counterexample(schedule=tuple(schedule), prop=prop_, result=result, build=build,
                          seed=seed, until=until, options=options, coverage=coverage)


def _kinds(faults: Sequence[str] | None, options: Mapping[str, Any]) -> list[str]:
    durable = options.get("storage") == "durable"
    if faults is None:
        return [k for k in FAULT_KINDS if durable or k != "storage_outage"]
    kinds = list(faults)
    unknown = [k for k in kinds if k not in FAULT_KINDS]
    if unknown or not kinds:
        raise ScenarioError(f"unknown fault kinds {unknown}; kinds: {FAULT_KINDS}")
    if "storage_outage" in kinds and not durable:
        raise ScenarioError("a storage outage needs options={'storage': 'durable'}")
    return kinds
