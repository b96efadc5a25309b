"""Byte-exact determinism pinned across code changes: seeded runs keep their recorded digests.

``test_sim.py`` checks that one build gives the same stream twice; this checks that the stream
is the one recorded in ``sim_digests.json`` (see ``sim_digests.py`` for when and how to
regenerate it), so a speed-up of the loop or the mesh cannot silently reorder events.
"""

from __future__ import annotations

import pytest
from sim_digests import SCENARIOS, compute, pinned

pytestmark = pytest.mark.fast  # `make check`: no process, server or session


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_seeded_run_matches_its_pinned_digest(name: str) -> None:
    pinned_run = pinned()[name]
    got = compute(name)
    assert got["events"] == pinned_run["events"], f"{name}: event count changed"
    assert got["digest"] == pinned_run["digest"], f"{name}: same count, different stream"
