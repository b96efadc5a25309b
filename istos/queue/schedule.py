"""Interval and cron schedules (filled in by the schedules work)."""

from __future__ import annotations

from ..hooks import AppHooks


class ScheduleMixin(AppHooks):
    pass
