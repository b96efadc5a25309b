"""The simulator's error: a scenario that asks for something impossible."""

from __future__ import annotations

from istos.errors import IstosError

__all__ = ["ScenarioError"]


class ScenarioError(IstosError, ValueError):
    """A scenario asks for something impossible (unknown node, time in the past...)."""
