"""The owner extensions an operator's tools need besides inspection: the workers table, the bulk
admin actions, wait/run distributions and discovery. One list: the app installs them in one
line."""

from __future__ import annotations

from ..extension import OwnerExtension
from ..handle import OwnerHandle
from ..leadership.discovery import Announce
from .bulk_admin import BulkAdmin
from .latency import Latency
from .workers import WorkerTracker
from .workflow_view import WorkflowView


def operator_extensions(owner: OwnerHandle) -> list[OwnerExtension]:
    """New extensions for ``owner`` (``pipeline.compose`` installs them in the declared order)."""
    tracker = WorkerTracker(owner)
    return [tracker, BulkAdmin(owner), Latency(owner, tracker.seen_count), WorkflowView(owner),
            Announce(owner)]
