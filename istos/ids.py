"""Id sources. Engine code takes ids from the node's source, never from a global uuid call."""

from __future__ import annotations

import os
import random


class IdSource:
    """Short random hex ids from a seedable rng (the simulator seeds it; live nodes use urandom).

    Lease tokens (:meth:`token`) must be unguessable to other sessions, so a live source draws
    them from the OS's CSPRNG (``os.urandom``, 4 KiB at a time: one system call per 256
    tokens); a source given ``token_rng`` (the simulator, seeded tests)
    draws them from that rng instead, keeping runs reproducible. Tokens never consume the id
    rng, so ids are the same sequence either way.
    """

    def __init__(self, rng: random.Random | None = None, *,
                 token_rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.Random(os.urandom(16))
        self._token_rng = token_rng
        self._entropy = ""
        self._at = 0

    def new(self) -> str:
        return f"{self._rng.getrandbits(96):024x}"

    def token(self) -> str:
        """A fresh 128-bit lease token (32 hex characters)."""
        if self._token_rng is not None:
            return f"{self._token_rng.getrandbits(128):032x}"
        at = self._at
        if at >= len(self._entropy):
            self._entropy, at = os.urandom(4096).hex(), 0  # 8,192 hex digits: 256 tokens
        self._at = at + 32
        return self._entropy[at:at + 32]


def node_rng(seed: int | None = None) -> random.Random:
    """The node's rng: seeded in the simulator, from the OS otherwise."""
    return random.Random(seed if seed is not None else os.urandom(16))
