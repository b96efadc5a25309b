"""The simulator: real Istos apps on a simulated mesh under virtual time.

See :class:`Simulation`; :func:`replay` runs a recorded :class:`Trace` again under another
policy.
"""

from ..data.trace import Trace, TraceFormatError
from .result import InvariantViolation, SimResult
from .simulation import ScenarioError, Simulation
from .workload import HandlerFailure

# After the submodules: ``istos_nb.sim.replay`` is the function, not its module.
from .replay import replay  # noqa: E402  (isort: skip)

__all__ = ["Simulation", "SimResult", "ScenarioError", "InvariantViolation", "HandlerFailure",
           "Trace", "TraceFormatError", "replay"]
