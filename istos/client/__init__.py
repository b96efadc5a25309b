"""The one request path every caller of a queue's owner shares.

The app's producer and workers, :class:`~istos.SyncProducer`, the CLI's operator and
``istos_nb``'s ``LiveQueue`` all reach owners through this package: one call with its retries
and deadline on the caller's clock, and the mapping of a reply's error to a typed exception
(:mod:`.call`), callers without a node and a client per queue (:mod:`.endpoint`), coalesced
enqueues (:mod:`.coalesce`), bulk enqueue frames (:mod:`.batches`), the client's side of
parked claims (:mod:`.parking`). Keys come from :mod:`istos.keys`. It imports neither the
owner nor the worker.
"""

from __future__ import annotations

from . import batches
from .call import Endpoint, OwnerClient, ReplyTooLarge, query_owner, raise_for_reply
from .endpoint import Clients, Remote

__all__ = ["Clients", "Endpoint", "OwnerClient", "Remote", "ReplyTooLarge", "batches",
           "query_owner", "raise_for_reply"]
