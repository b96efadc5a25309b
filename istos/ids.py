"""Id sources. Engine code takes ids from the node's source, never from a global uuid call."""

from __future__ import annotations

import os
import random


class IdSource:
    """Short random hex ids from a seedable rng (the simulator seeds it; live nodes use urandom)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.Random(os.urandom(16))

    def new(self) -> str:
        return f"{self._rng.getrandbits(96):024x}"


def node_rng(seed: int | None = None) -> random.Random:
    """The node's rng: seeded in the simulator, from the OS otherwise."""
    return random.Random(seed if seed is not None else os.urandom(16))
