"""Publish/subscribe and the idempotency ledger (filled in by the events work)."""

from __future__ import annotations

from .hooks import AppHooks


class PubSubMixin(AppHooks):
    pass
