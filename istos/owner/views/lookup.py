"""The ``resolve`` op: which job ids start with a prefix, so people can type the short ids
that demos, charts and tables print (``istos why q 3fa9c1``) and scripts can still insist on
whole ids.

A prefix must be at least :data:`~istos.protocol.MIN_ID_PREFIX` characters; the reply names at
most :data:`~istos.protocol.MAX_RESOLVE_MATCHES` ids and says whether there were more. The scan
walks the owner's records in slices, yielding between them, so a deep queue keeps serving
claims while someone looks an id up.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from ... import protocol
from ..extension import Handler, OwnerExtension
from ..handle import OwnerHandle
from .slicing import pause

SLICE = 4096  # ids compared between two yields to the loop


class IdLookup(OwnerExtension):
    """Serves ``resolve`` (read role) on one owner."""

    name = "lookup"
    serves = ("resolve",)

    def __init__(self, owner: OwnerHandle) -> None:
        self.owner = owner

    def ops(self) -> Mapping[str, Handler]:
        return {"resolve": self.op_resolve}

    async def op_resolve(self, msg: dict[str, Any]) -> dict[str, Any]:
        prefix = str(msg["prefix"])
        jobs = self.owner.state.jobs
        if prefix in jobs:  # a whole id is its own answer, however many ids it starts
            return {"matches": [prefix], "more": False}
        await pause()  # the copy below in a step of its own (see slicing.Slicer)
        ids = list(jobs)  # a snapshot: records may come and go while we yield
        found: list[str] = []
        cap = protocol.MAX_RESOLVE_MATCHES
        for start in range(0, len(ids), SLICE):
            found.extend(itertools.islice(
                (i for i in ids[start:start + SLICE] if i.startswith(prefix)),
                cap + 1 - len(found)))
            if len(found) > cap:
                break
            await pause()
        return {"matches": found[:cap], "more": len(found) > cap}
