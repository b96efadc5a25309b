"""The simulator: real Istos apps on a simulated mesh under virtual time.

See :class:`Simulation`; :func:`replay` runs a recorded :class:`Trace` again under another
policy; :func:`explore` searches fault schedules for a run that breaks a property.
"""

from ..data.trace import Trace, TraceFormatError
from .result import InvariantViolation, SimResult
from .simulation import ScenarioError, Simulation
from .workload import HandlerFailure

# After the submodules: ``istos_nb.sim.replay`` is the function, not its module.
from .replay import replay  # noqa: E402  (isort: skip)
from .explore import (  # noqa: E402  (isort: skip)
    Counterexample, Fault, NoCounterexample, duplicated, explore, find)

__all__ = ["Simulation", "SimResult", "ScenarioError", "InvariantViolation", "HandlerFailure",
           "Trace", "TraceFormatError", "replay", "explore", "find", "duplicated", "Fault",
           "Counterexample", "NoCounterexample"]
