"""The simulator: real Istos apps on a simulated mesh under virtual time.

See :class:`Simulation`.
"""

from .result import InvariantViolation, SimResult
from .simulation import ScenarioError, Simulation
from .workload import HandlerFailure

__all__ = ["Simulation", "SimResult", "ScenarioError", "InvariantViolation", "HandlerFailure"]
