"""How long an event loop's callbacks hold it, in CPU time, and how long the GC stops it.

A latency figure taken while other processes share two cores mixes the owner's own stalls
with the scheduler's; the CPU time of each loop step (``time.thread_time`` around every
callback) and of each cyclic-GC pass does not. :class:`LoopMeter` patches
``asyncio.Handle._run`` in this process only (benchmarks, never the engine).
"""

from __future__ import annotations

import asyncio.events
import gc
import time
from collections.abc import Callable
from typing import Any


class LoopMeter:
    """Collects the CPU time of every loop step and GC pass until :meth:`take`."""

    def __init__(self) -> None:
        self.steps: list[float] = []
        self.gc: list[tuple[int, float]] = []
        self._gc_started = 0.0
        self._orig: Callable[[Any], None] | None = None

    def install(self) -> None:
        """Start measuring (patches ``asyncio.Handle._run`` and adds a GC callback)."""
        orig = asyncio.events.Handle._run
        steps = self.steps

        def run(handle: Any) -> None:
            t0 = time.thread_time()
            orig(handle)
            steps.append(time.thread_time() - t0)

        self._orig = orig
        asyncio.events.Handle._run = run  # type: ignore[method-assign,assignment]
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.thread_time()
        else:
            self.gc.append((int(info["generation"]), time.thread_time() - self._gc_started))

    def take(self) -> dict[str, Any]:
        """The figures since the last take (ms), and start afresh."""
        steps, full = sorted(self.steps), [s for g, s in self.gc if g == 2]
        self.steps.clear()
        self.gc.clear()
        n = len(steps)
        return {"steps": n,
                "step_p99_ms": steps[min(n - 1, int(n * 0.99))] * 1e3 if n else 0.0,
                "step_max_ms": steps[-1] * 1e3 if n else 0.0,
                "full_gcs": len(full), "full_gc_max_ms": max(full) * 1e3 if full else 0.0}
