"""PURE: the W3C trace context a traced producer puts into a job's ``meta`` (``istos.tracing``).

A traced enqueue adds ``meta["trace"] = {"traceparent": ..., "tracestate"?: ...}``; the worker
reads it back to parent its spans, so one job's attempts share the producer's trace. The entry
travels in every claim reply and sits in storage, so it is bounded here and checked by the
owner's schema (``protocol.meta``) like any field: ``traceparent`` is the W3C version-00 form
(55 characters), ``tracestate`` at most :data:`MAX_TRACESTATE_BYTES` of printable ASCII.

The entry is not workflow meta: the owner checks the rest of ``meta`` (:func:`without_trace`)
as the workflow code wrote it, and a job whose meta is only a trace entry is a plain job.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import ProtocolError

TRACE_KEY = "trace"
MAX_TRACESTATE_BYTES = 512  # W3C: vendors propagate at least 512 characters
_TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_TRACESTATE = re.compile(r"[\x20-\x7e]*")


def check_trace(name: str, value: Any) -> None:
    """Refuse (:class:`ProtocolError` naming ``name``) a trace entry of another shape than
    ``{"traceparent": <W3C version 00>, "tracestate"?: <printable ASCII, bounded>}``."""
    if type(value) is not dict or "traceparent" not in value \
            or not set(value) <= {"traceparent", "tracestate"}:
        raise ProtocolError(f"{name} must be a map of traceparent and (optional) tracestate")
    parent = value["traceparent"]
    if type(parent) is not str or _TRACEPARENT.fullmatch(parent) is None:
        raise ProtocolError(f"{name}.traceparent must be a W3C traceparent "
                            "'00-<32 hex>-<16 hex>-<2 hex>'")
    state = value.get("tracestate")
    if state is not None and (type(state) is not str or len(state) > MAX_TRACESTATE_BYTES
                              or _TRACESTATE.fullmatch(state) is None):
        raise ProtocolError(f"{name}.tracestate must be printable ASCII of at most "
                            f"{MAX_TRACESTATE_BYTES} characters")


def without_trace(meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """``meta`` without its trace entry (None when nothing else is left): what the owner's
    workflow checks and operator views read."""
    if not meta or TRACE_KEY not in meta:
        return meta
    rest = {k: v for k, v in meta.items() if k != TRACE_KEY}
    return rest or None


def trace_only(meta: Any) -> bool:
    """Whether ``meta`` is a map holding a trace entry and nothing else."""
    return type(meta) is dict and len(meta) == 1 and TRACE_KEY in meta
