"""The public ``istos_nb.frames`` module: JobEvent streams as pandas DataFrames.

Notebooks and the README import this name; the code lives in :mod:`istos_nb.views.frames`.
"""

from __future__ import annotations

from .views.frames import (
    EventsLike,
    attempts_frame,
    depth_frame,
    events_frame,
    jobs_frame,
    leases_frame,
    node_events_frame,
    throughput_frame,
    worker_node,
)

__all__ = [
    "EventsLike", "attempts_frame", "depth_frame", "events_frame", "jobs_frame", "leases_frame",
    "node_events_frame", "throughput_frame", "worker_node",
]
