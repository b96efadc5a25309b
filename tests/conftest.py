"""Fixtures shared by several test modules (helpers that are not fixtures live in helpers.py).

A module that defines a fixture of the same name keeps its own: pytest prefers the closer one.
"""

from __future__ import annotations

import pytest

from istos.transport.local import LocalMesh


@pytest.fixture
def mesh() -> LocalMesh:
    """A fresh in-process mesh: reliable, next-loop-turn delivery, nothing shared with others."""
    return LocalMesh()
