"""The simulated network: latency, loss and partitions between nodes, all from the seed."""

from __future__ import annotations

import random

from istos.errors import ConfigError


class SimNetwork:
    """A :class:`istos.transport.local.NetworkModel` driven by the simulation's rng.

    Every message draws its latency uniformly from ``latency_s`` and is lost with probability
    ``loss``; a partition drops every message between its two sides until healed. Messages a
    node sends to itself never cross the network.
    """

    def __init__(self, rng: random.Random, latency_s: tuple[float, float] = (0.0005, 0.002),
                 loss: float = 0.0) -> None:
        self.rng = rng
        self.lost = 0
        self.sent = 0
        self._cut: set[tuple[str, str]] = set()
        self.configure(latency_s=latency_s, loss=loss)

    def configure(self, *, latency_s: tuple[float, float] | None = None,
                  loss: float | None = None) -> None:
        if latency_s is not None:
            lo, hi = (float(x) for x in latency_s)
            if lo < 0 or hi < lo:
                raise ConfigError(f"latency_s must be (lo, hi) with 0 <= lo <= hi, got "
                                  f"{latency_s!r}")
            self.latency_s = (lo, hi)
        if loss is not None:
            if not 0.0 <= loss < 1.0:
                raise ConfigError(f"loss must be a probability in [0, 1), got {loss!r}")
            self.loss = float(loss)

    def delay(self, src: str, dst: str) -> float | None:
        if src == dst:
            return 0.0
        self.sent += 1
        if (src, dst) in self._cut:
            self.lost += 1
            return None
        if self.loss and self.rng.random() < self.loss:
            self.lost += 1
            return None
        lo, hi = self.latency_s
        # random.uniform(lo, hi) is exactly this; inlined, as it runs for every message
        return lo if lo == hi else lo + (hi - lo) * self.rng.random()

    def reachable(self, src: str, dst: str) -> bool:
        return src == dst or (src, dst) not in self._cut

    def partition(self, side_a: set[str], side_b: set[str]) -> None:
        for a in side_a:
            for b in side_b:
                self._cut.add((a, b))
                self._cut.add((b, a))

    def heal(self, side_a: set[str], side_b: set[str]) -> None:
        for a in side_a:
            for b in side_b:
                self._cut.discard((a, b))
                self._cut.discard((b, a))
