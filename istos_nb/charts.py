"""The public ``istos_nb.charts`` module: matplotlib figures of the frames.

Notebooks and the README import this name; the code lives in :mod:`istos_nb.views.charts`.
"""

from __future__ import annotations

from .views.charts import (
    DEPTH_COLORS,
    FINISH_COLORS,
    OUTCOME_COLORS,
    attempts_histogram,
    backoff_band,
    backoff_curve,
    depth_chart,
    lease_gantt,
    resize,
    retry_timeline,
    throughput_chart,
)

__all__ = [
    "DEPTH_COLORS", "FINISH_COLORS", "OUTCOME_COLORS", "attempts_histogram", "backoff_band",
    "backoff_curve", "depth_chart", "lease_gantt", "resize", "retry_timeline",
    "throughput_chart",
]
