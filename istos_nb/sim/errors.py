"""The simulator's error: a scenario that asks for something impossible.

One concept at two layers: the error tree is ``istos/errors.py``; this is the simulator's
leaf of it.
"""

from __future__ import annotations

from istos.errors import IstosError

__all__ = ["ScenarioError"]


class ScenarioError(IstosError, ValueError):
    """A scenario asks for something impossible (unknown node, time in the past...)."""
