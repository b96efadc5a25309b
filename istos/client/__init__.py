"""The one request path every caller of a queue's owner shares.

The app's producer and workers, :class:`~istos.SyncProducer`, the CLI's operator and
``istos_nb``'s ``LiveQueue`` all reach owners through this package: one call with its retries
and deadline (:mod:`.call`), the mapping of a reply's error to a typed exception, coalesced
enqueues (:mod:`.coalesce`), bulk enqueue frames (:mod:`.batches`). It imports neither the
owner nor the worker.
"""

from __future__ import annotations

from . import batches
from .call import OwnerClient, query_owner, raise_for_reply

__all__ = ["OwnerClient", "batches", "query_owner", "raise_for_reply"]
