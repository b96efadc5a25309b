"""What :func:`~istos_nb.sim.explore.explore` hands back: a counterexample, or what it covered.

A :class:`Counterexample` is a fault schedule and the run it produced: it replays exactly, tells
its story in numbered lines (``str(ce)``), draws the lease Gantt with the faults marked
(:meth:`Counterexample.chart`, drawn by ``istos_nb.views.explore_chart``) and writes a pytest
test that reproduces it. A :class:`NoCounterexample` says how many schedules ran and what they
reached; it never claims a proof.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import ScenarioError
from .faultplan import Build, Fault, run_schedule
from .result import SimResult
from .story import involved_jobs, story_lines, violation_moment

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["Property", "Coverage", "Counterexample", "NoCounterexample"]


@dataclass(frozen=True)
class Property:
    """A property of a run: ``name`` (what a person reads), ``check(result)`` True when it
    holds; ``expr``, when given, a Python expression over ``result`` that is True when it is
    broken (a generated test asserts it). ``invariant`` names a row of ``SimResult.check()``."""

    name: str
    check: Callable[[SimResult], bool]
    expr: str | None = None
    invariant: str | None = None

    @classmethod
    def invariant_named(cls, name: str) -> Property:
        """The checker's invariant ``name`` (an exact name of ``SimResult.check()``'s rows);
        an unknown name raises :class:`ScenarioError` on the first run."""
        def check(result: SimResult) -> bool:
            report = result.check()
            row = report[report["invariant"] == name]
            if row.empty:
                raise ScenarioError(f"no invariant named {name!r}; the checker has: "
                                    f"{list(report['invariant'])}")
            return bool(row["ok"].iloc[0])

        return cls(name, check, invariant=name)


@dataclass
class Coverage:
    """What a search ran: schedules, faults drawn by kind, and runs that reached each state
    worth reaching (a redelivery after a lease ran out, a failover to another owner, a
    deposed leader coming back, whose writes its successor's epoch fences)."""

    schedules: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    reached: Counter[str] = field(default_factory=Counter)

    def add(self, schedule: tuple[Fault, ...], result: SimResult) -> None:
        self.schedules += 1
        self.faults.update(f.kind for f in schedule)
        self.reached.update(_reached(result))

    def text(self) -> str:
        kinds = ", ".join(f"{k} x{n}" for k, n in sorted(self.faults.items())) or "none"
        reach = ", ".join(f"{what}: {self.reached[what]} runs" for what in REACHED)
        return f"faults drawn: {kinds}; runs that reached {reach}"


REACHED = ("a redelivery", "a failover", "a deposed leader back (fenced)")


def _reached(result: SimResult) -> set[str]:
    out: set[str] = set()
    expired: set[str] = set()
    leaders: dict[str, str] = {}  # queue -> node that came up last
    deposed: dict[str, float] = {}  # node -> when another took its queue over
    for e in result.events_raw:
        kind, node = e["kind"], e["node"]
        if kind == "lease_expired":
            expired.add(e["job_id"])
        elif kind == "claimed" and e["job_id"] in expired:
            out.add(REACHED[0])
        elif kind == "owner_up":
            old = leaders.get(e["queue"])
            if old is not None and old != node:
                out.add(REACHED[1])
                deposed[old] = e["t"]
            leaders[e["queue"]] = node
        elif kind == "crashed":
            deposed.pop(node, None)
        elif kind in ("resumed", "healed") and any(n in deposed for n in node.split(",")):
            out.add(REACHED[2])
    return out


@dataclass
class Counterexample:
    """A fault ``schedule`` under which ``prop`` fails, and the run it produced (``result``).

    ``str(ce)`` is its numbered story; :meth:`replay` runs it again (the same events);
    :meth:`chart` draws it; :meth:`to_test` writes a pytest test reproducing it. Truthy."""

    schedule: tuple[Fault, ...]
    prop: Property
    result: SimResult = field(repr=False)
    build: Build = field(repr=False)
    seed: int = 0
    until: float = 60.0
    options: dict[str, Any] = field(default_factory=dict)
    coverage: Coverage = field(default_factory=Coverage, repr=False)

    def replay(self) -> SimResult:
        """Run the schedule again: the same scenario, seed and faults, so the same events."""
        return run_schedule(self.build, self.schedule, seed=self.seed, until=self.until,
                            options=self.options)

    @property
    def jobs(self) -> list[str]:
        """The jobs the violation is about (ran twice, lost, or named by a failed check)."""
        return involved_jobs(self.result, self._failed())

    @property
    def moment(self) -> float | None:
        """When the property broke, as far as the events show (None if they do not)."""
        return violation_moment(self.result, self.jobs)

    def _failed(self) -> list[tuple[str, str]]:
        report = self.result.check()
        bad = report[~report["ok"]]
        return list(zip(bad["invariant"], bad["detail"], strict=True))

    def story(self) -> str:
        """The run in numbered lines: the faults, what the involved jobs went through, and
        the verdict."""
        lines = story_lines(self.result, self.schedule, self.jobs, self._failed(),
                            self.prop.name)
        n = len(self.schedule)
        head = (f"Counterexample to '{self.prop.name}': {n} fault{'s' if n != 1 else ''} "
                f"(seed {self.seed}, {self.coverage.schedules} schedules searched)")
        width = len(str(len(lines)))
        return "\n".join([head, *(f"{i:>{width}}. {line}" for i, line in
                                  enumerate(lines, 1))])

    def __str__(self) -> str:
        return self.story()

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython shows the story, not the dataclass fields."""
        printer.text(self.story())

    def chart(self, ax: Axes | None = None) -> Figure:
        """The lease Gantt of the run, faults shaded and the violating moment marked (drawn
        by ``istos_nb.views.explore_chart``: needs matplotlib)."""
        from istos_nb.views.explore_chart import counterexample_chart

        return counterexample_chart(self, ax=ax)

    def to_test(self, name: str | None = None) -> str:
        """The source of a pytest test that reruns this schedule and asserts the property
        fails again (turn its last assert round once the behaviour is fixed). ``build`` is
        imported when it is a module's top-level function, else its source is inlined;
        raises :class:`ScenarioError` when neither is possible (a lambda, a REPL function)."""
        build_src, build_name = _build_source(self.build)
        test = name or "test_" + (re.sub(r"\W+", "_", self.prop.name).strip("_").lower()
                                  or "counterexample")
        faults = "".join(f"    {f!r},\n" for f in self.schedule)
        story = "".join(f"# {line}\n" for line in self.story().splitlines())
        return (f'"""{self.prop.name}: a counterexample explore found."""\n\n'
                "from istos_nb.sim.faultplan import Fault, run_schedule\n"
                f"{build_src}\n\n{story}SCHEDULE = (\n{faults})\n\n\n"
                f"def {test}():\n"
                f"    result = run_schedule({build_name}, SCHEDULE, seed={self.seed!r}, "
                f"until={self.until!r},\n"
                f"                          options={self.options!r})\n"
                f"{_assertion(self)}")


def _assertion(ce: Counterexample) -> str:
    if ce.prop.invariant is not None:
        return ("    report = result.check()\n"
                f"    row = report[report['invariant'] == {ce.prop.invariant!r}]\n"
                "    assert not row['ok'].iloc[0], 'the invariant holds again'\n")
    if ce.prop.expr is not None:
        return f"    assert {ce.prop.expr}\n"
    return f"    assert result.counts == {dict(ce.result.counts)!r}\n"


def _build_source(build: Build) -> tuple[str, str]:
    module, qualname = getattr(build, "__module__", None), getattr(build, "__qualname__", "")
    if module and module != "__main__" and qualname.isidentifier():
        return f"from {module} import {qualname}\n", qualname
    try:
        src = textwrap.dedent(inspect.getsource(build))
    except (OSError, TypeError) as exc:
        raise ScenarioError(f"cannot write the source of build {build!r}: {exc}") from None
    name = getattr(build, "__name__", "")
    if not name.isidentifier():
        raise ScenarioError("to_test needs build to be a named function, not a lambda")
    return src, name


@dataclass
class NoCounterexample:
    """The search ran out of budget without breaking the property: what it covered. Falsy.

    It is no proof: another schedule, seed or scenario may still break the property."""

    prop_name: str
    coverage: Coverage

    @property
    def schedules(self) -> int:
        return self.coverage.schedules

    def __bool__(self) -> bool:
        return False

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython shows the sentence, not the dataclass fields."""
        printer.text(str(self))

    def __str__(self) -> str:
        return (f"'{self.prop_name}': no counterexample in {self.schedules} schedules "
                f"covering these fault kinds ({self.coverage.text()}). A search, not a proof.")
