"""Chain, group and chord (filled in by the workflows work)."""

from __future__ import annotations

from ..hooks import AppHooks


class WorkflowMixin(AppHooks):
    pass
