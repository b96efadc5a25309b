"""The trace file: what ``istos record`` writes and ``istos_nb.sim.Trace.load`` reads.

A trace is the owner's own event stream for one queue over a stretch of time, plus what the
stream cannot say by itself (the queue's declared policy, from ``stats``). It lives here, on the
engine side and outside ``istos.ops`` (which the simulator may not import), because the CLI
writes it and ``istos`` never imports ``istos_nb``; the notebook
side derives its tables (jobs, attempts, fleet, crashes) from the same events on load, so the
file keeps facts and never a second opinion about them.

Format (JSON lines, UTF-8, optionally gzip-compressed when the name ends in ``.gz``):

- line 1, the header: ``{"format": "istos-trace", "version": 1, "queue": ..., "policy": {...},
  "started": epoch s, "ended": epoch s, "source": "follow" | "events" | "simulation",
  "dropped": n, "fleet": [{"node", "slots", "concurrency"}...]}``;
- then one line per event, each ``JobEvent.to_dict()``-shaped (``t``, ``node``, ``queue``,
  ``job_id``, ``kind``, ``attempt``, ``worker``, ``detail``);
- then, optionally, one line per job body seen: ``{"body_of": job_id, "size": bytes,
  "data": decoded body or null}``.

Readers refuse another ``format`` or a newer ``version`` with :class:`TraceFormatError` naming
the line; unknown header keys are kept (a newer writer of the same version may add some).
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from .errors import IstosError

__all__ = ["TRACE_FORMAT", "TRACE_VERSION", "TraceFormatError", "fleet_of", "header",
           "read_trace", "write_trace"]

TRACE_FORMAT = "istos-trace"
TRACE_VERSION = 1
MAX_LINE = 1 << 20  # one event or body line; anything longer is not ours
_EVENT_KEYS = ("t", "node", "queue", "job_id", "kind", "attempt", "worker", "detail")


class TraceFormatError(IstosError, ValueError):
    """A trace file (or event list) is not one this version can read; names what and where."""


def fleet_of(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The worker nodes the events show: per node its slot ids seen and the most deliveries
    it held at once (its effective concurrency; prefetched jobs hold slots too)."""
    slots: dict[str, set[str]] = {}
    open_: dict[str, set[tuple[str, int]]] = {}
    peak: dict[str, int] = {}
    for e in sorted(events, key=lambda e: e["t"]):
        worker = e.get("worker")
        if not worker or not e.get("job_id"):
            continue
        node = str(worker).split(":", 1)[0]
        key = (str(e["job_id"]), int(e.get("attempt") or 0))
        held = open_.setdefault(node, set())
        if e["kind"] == "claimed":
            slots.setdefault(node, set()).add(str(worker))
            held.add(key)
            peak[node] = max(peak.get(node, 0), len(held))
        elif e["kind"] in ("acked", "nacked", "lease_expired", "cancelled"):
            held.discard(key)
    # A slot's next claim can reach the owner before its previous ack (they travel apart),
    # so the peak may count a slot twice; a node never holds more leases than its slots.
    return [{"node": n, "slots": len(s), "concurrency": min(len(s), peak.get(n, 1))}
            for n, s in sorted(slots.items())]


def header(queue: str, policy: dict[str, Any], events: list[dict[str, Any]], *,
           started: float, ended: float, source: str, dropped: int = 0) -> dict[str, Any]:
    """The header line for these events of ``queue``."""
    return {"format": TRACE_FORMAT, "version": TRACE_VERSION, "queue": queue,
            "policy": dict(policy), "started": float(started), "ended": float(ended),
            "source": source, "dropped": int(dropped), "fleet": fleet_of(events)}


def _open(path: str | Path, mode: str) -> IO[str]:
    if str(path).endswith(".gz"):
        return gzip.open(path, mode + "t", encoding="utf-8")  # type: ignore[return-value]
    return open(path, mode, encoding="utf-8")


def write_trace(path: str | Path, head: dict[str, Any], events: Iterable[dict[str, Any]],
                bodies: Iterable[dict[str, Any]] = ()) -> None:
    """Write a trace file (see the module docstring). Bodies must be JSON-able already."""
    with _open(path, "w") as f:
        f.write(json.dumps(head, allow_nan=False) + "\n")
        for e in events:
            f.write(json.dumps({k: e.get(k) for k in _EVENT_KEYS}, default=_jsonable) + "\n")
        for b in bodies:
            f.write(json.dumps(b, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    return repr(value)


def read_trace(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]],
                                          list[dict[str, Any]]]:
    """``(header, events, bodies)`` of a trace file, every line checked (TraceFormatError)."""
    with _open(path, "r") as f:
        lines = _lines(f, path)
        head = _check_header(next(lines, (1, None)), path)
        events: list[dict[str, Any]] = []
        bodies: list[dict[str, Any]] = []
        for n, item in lines:
            if isinstance(item, dict) and "body_of" in item:
                bodies.append(check_body(item, f"{path}:{n}"))
            else:
                events.append(check_event(item, f"{path}:{n}"))
    return head, events, bodies


def _lines(f: IO[str], path: str | Path) -> Iterator[tuple[int, Any]]:
    for n, line in enumerate(f, 1):
        if len(line) > MAX_LINE:
            raise TraceFormatError(f"{path}:{n}: line longer than {MAX_LINE} characters")
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except ValueError as exc:
            raise TraceFormatError(f"{path}:{n}: not JSON ({exc})") from None


def _check_header(first: tuple[int, Any], path: str | Path) -> dict[str, Any]:
    n, head = first
    where = f"{path}:{n}"
    if not isinstance(head, dict) or head.get("format") != TRACE_FORMAT:
        raise TraceFormatError(f"{where}: not an Istos trace (the first line must be a header "
                               f"with format {TRACE_FORMAT!r}; `istos record` writes one)")
    version = head.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise TraceFormatError(f"{where}: bad trace version {version!r}")
    if version > TRACE_VERSION:
        raise TraceFormatError(f"{where}: trace version {version} is newer than this Istos "
                               f"reads ({TRACE_VERSION}); upgrade to load it")
    if not isinstance(head.get("queue"), str) or not isinstance(head.get("policy"), dict):
        raise TraceFormatError(f"{where}: the header needs a queue (text) and a policy (map)")
    return head


def check_event(item: Any, where: str) -> dict[str, Any]:
    """One event dict, its types checked (the file and the stream are untrusted)."""
    if not isinstance(item, dict):
        raise TraceFormatError(f"{where}: an event must be a JSON object, got "
                               f"{type(item).__name__}")
    t = item.get("t")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
        raise TraceFormatError(f"{where}: event time t must be a finite number, got {t!r}")
    for key in ("kind", "job_id"):
        if not isinstance(item.get(key), str):
            raise TraceFormatError(f"{where}: event {key} must be text, got {item.get(key)!r}")
    attempt = item.get("attempt", 0)
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        raise TraceFormatError(f"{where}: event attempt must be an integer >= 0, got "
                               f"{attempt!r}")
    worker = item.get("worker")
    if worker is not None and not isinstance(worker, str):
        raise TraceFormatError(f"{where}: event worker must be text or null, got {worker!r}")
    detail = item.get("detail") or {}
    if not isinstance(detail, dict):
        raise TraceFormatError(f"{where}: event detail must be an object, got {detail!r}")
    return {"t": float(t), "node": str(item.get("node") or ""), "queue":
            str(item.get("queue") or ""), "job_id": item["job_id"], "kind": item["kind"],
            "attempt": attempt, "worker": worker, "detail": dict(detail)}


def check_body(item: dict[str, Any], where: str) -> dict[str, Any]:
    size = item.get("size")
    if not isinstance(item.get("body_of"), str) or isinstance(size, bool) \
            or not isinstance(size, int) or size < 0:
        raise TraceFormatError(f"{where}: a body line needs body_of (text) and size (int >= 0)")
    return {"body_of": item["body_of"], "size": size, "data": item.get("data")}
