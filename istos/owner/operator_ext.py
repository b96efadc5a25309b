"""The owner extensions an operator's tools need besides inspection: the workers table, the bulk
admin actions and discovery. One list, so the app installs them in one line."""

from __future__ import annotations

from .bulk_admin import BulkAdmin
from .extension import OwnerExtension
from .owner import QueueOwner
from .workers import WorkerTracker


def operator_extensions(owner: QueueOwner) -> list[OwnerExtension]:
    """New extensions for ``owner``, in the order to add them (after ``LeaseOps``)."""
    return [WorkerTracker(owner), BulkAdmin(owner)]
