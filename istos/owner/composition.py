"""The owner pipeline: which extensions serve an app's queue owners, in which order.

Not the producer's pipelining (``istos/pipeline.py``): this module is named for what it does,
composing the owner's extensions, so the two never share a file name.

The order is data. :data:`OWNER_PIPELINE` names every extension an app installs on each of its
owners, innermost first; :func:`compose` installs them in that order and nowhere else, so the
chain that serves an op is read here, not pieced together from comments. Each extension
declares the ops it adds (``serves``) and the ops it wraps (``wraps``, see
``owner/extension.py``); a wrapper wraps everything named before it that serves or wraps the
same op. For ``claim`` that is, from the outside in: ``parking`` (a woken parked claim runs
again through every other wrapper), ``workers`` (counts the claim's worker), ``leases``
(progress riding on the claim, cancellations in its reply), then the owner's own claim.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import ConfigError
from .extension import OwnerExtension
from .handle import OwnerHandle

OWNER_PIPELINE: tuple[str, ...] = (
    "schedules",      # serves enqueue_slot (features/schedule.py)
    "workflows",      # chord ops, revive; the meta check; before ack (features/workflow.py)
    "batches",        # batch ops; wraps enqueue (batch meta); before ack (extensions/)
    "inspect",        # stats, jobs, why, events, follow, pause, ... (views/inspect.py)
    "lookup",         # resolve (views/lookup.py)
    "series",         # series (views/series.py)
    "leases",         # extend, cancel; wraps claim, settle (extensions/leases_ext.py)
    "workers",        # workers; wraps claim, extend, release (views/workers.py)
    "bulk_admin",     # requeue_all_dead (redrive), promote, purge_dead_older (views/bulk_admin.py)
    "latency",        # wraps stats (views/latency.py)
    "workflow_view",  # states; wraps why (views/workflow_view.py)
    "announce",       # the discovery token (leadership/discovery.py)
    "local_nudge",    # nudges this node's own runners in-process (app.py)
    "parking",        # unpark; wraps claim, outermost (extensions/parking.py)
    "deps",           # dep_watch, dep_report; wraps enqueue, why (extensions/deps_ext.py)
)
"""Every extension of an app's queue owner, by name, in the order they are installed."""


def compose(owner: OwnerHandle, extensions: Iterable[OwnerExtension]) -> None:
    """Install ``extensions`` on ``owner`` in the order of :data:`OWNER_PIPELINE`.

    Raises:
        ConfigError: an extension is missing, unnamed, unknown or given twice, or serves an
            op something installed before it serves already (it must declare it wraps it).
    """
    by_name: dict[str, OwnerExtension] = {}
    for ext in extensions:
        if ext.name not in OWNER_PIPELINE or ext.name in by_name:
            raise ConfigError(f"owner extension {ext.name!r} ({type(ext).__name__}) is not "
                              f"in the owner pipeline, or given twice: {OWNER_PIPELINE}")
        by_name[ext.name] = ext
    missing = [name for name in OWNER_PIPELINE if name not in by_name]
    if missing:
        raise ConfigError(f"the owner pipeline misses {missing}")
    for name in OWNER_PIPELINE:
        ext = by_name[name]
        taken = [op for op in ext.serves if owner.handler(op) is not None]
        if taken:
            raise ConfigError(f"owner extension {name!r} serves {taken}, served before it; "
                              "an extension that changes an op declares that it wraps it")
        owner.extend(ext)
