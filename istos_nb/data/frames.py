"""Turn a JobEvent stream into pandas DataFrames.

One module at two layers: this implementation, and its public name :mod:`istos_nb.frames`.

Every function here accepts the events in any of the forms the notebook side meets: a list (or
any iterable) of :class:`istos.events.JobEvent`, a list of ``JobEvent.to_dict()``-shaped dicts,
or a DataFrame with those columns (``detail`` as a dict column, or its fields already flattened
into ``error``/``delay_s``/``ready_at``/``deadline``/``priority`` columns). Nothing here knows
whether the events came from the simulator or a live owner: ``t`` is kept as given (virtual
seconds or epoch seconds); instants given as pandas Timestamps (a live frame) become epoch
seconds and Timedeltas seconds.

Every returned DataFrame has a fixed column order and fixed dtypes, also when it has no rows,
so callers (charts, widgets) never special-case an empty stream. Text columns are ``object``
dtype holding ``str`` or ``None``; missing times are ``NaN``.

Public as :mod:`istos_nb.frames`, which re-exports this module's ``__all__`` (one module at
two layers: the public name, and this implementation).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import pandas as pd

from istos import events as ev
from istos.errors import ConfigError
from istos.events import JobEvent

__all__ = [
    "EventsLike", "attempts_frame", "depth_frame", "events_frame", "jobs_frame", "leases_frame",
    "node_events_frame", "throughput_frame", "worker_node",
]

EventsLike: TypeAlias = pd.DataFrame | Iterable[JobEvent] | Iterable[Mapping[str, Any]] | None

_BASE_COLUMNS = ("t", "node", "queue", "job_id", "kind", "attempt", "worker", "detail")
_FLAT_FIELDS = ("error", "delay_s", "ready_at", "deadline", "priority")

# Column order and dtypes of every frame, as "name:code" (f float64, i int64, I nullable Int64,
# b bool, o object holding str/None or dicts).
_DTYPES: dict[str, Any] = {"f": "float64", "i": "int64", "I": "Int64", "b": "bool", "o": object}


def _schema(spec: str) -> dict[str, Any]:
    return {name: _DTYPES[code] for name, code in (f.split(":") for f in spec.split())}


_EVENT_SCHEMA = _schema("t:f node:o queue:o job_id:o kind:o attempt:i worker:o detail:o error:o "
                        "delay_s:f ready_at:f deadline:f priority:I")
_JOB_SCHEMA = _schema("job_id:o queue:o state:o attempts:i deliveries:i enqueued_at:f "
                      "finished_at:f last_error:o priority:I acks:i duplicated:b "
                      "progress:f progress_note:o")
_LEASE_SCHEMA = _schema("job_id:o queue:o attempt:i worker:o node:o start:f end:f deadline:f "
                        "outcome:o error:o renewals:i")
_ATTEMPT_SCHEMA = _schema("job_id:o attempt:i claimed_at:f finished_at:f outcome:o error:o "
                          "backoff_s:f waited_s:f")
_DEPTH_SCHEMA = _schema("t:f ready:i leased:i delayed:i dead:i done:i waiting:i")
_THROUGHPUT_SCHEMA = _schema("t:f acked:i nacked:i expired:i dead_lettered:i enqueued:i")
_NODE_EVENT_SCHEMA = _schema("t:f node:o kind:o")
_EVENT_DTYPE_NAMES = [str(pd.Series([], dtype=d).dtype) for d in _EVENT_SCHEMA.values()]

# Kinds that belong to one job; queue-level (owner_up/down) and node-level (crashed/restarted)
# events carry job_id "" and never touch a job's state.
_JOB_KINDS = frozenset({
    ev.ENQUEUED, ev.DUPLICATE_ENQUEUE, ev.CLAIMED, ev.ACKED, ev.NACKED, ev.LEASE_EXPIRED,
    ev.RETRY_SCHEDULED, ev.DEAD_LETTERED, ev.RESULT_EXPIRED, ev.PURGED,
    ev.CANCELLED, ev.PROGRESS, ev.EXPIRED, ev.UPDATED, ev.WAITING, ev.UNBLOCKED,
})
_FIXED_STATE = {
    ev.CLAIMED: "leased", ev.ACKED: "done", ev.DEAD_LETTERED: "dead",
    ev.RESULT_EXPIRED: "expired", ev.PURGED: "purged", ev.CANCELLED: "cancelled",
    ev.EXPIRED: "expired",  # its start deadline passed before it started
    ev.WAITING: "waiting",  # enqueued with after=: claimable once its parents release it
}
_LEASE_CLOSE = {ev.ACKED: "acked", ev.NACKED: "nacked", ev.LEASE_EXPIRED: "expired"}
_DEPTH_STATES = ("ready", "leased", "delayed", "dead", "done", "waiting")
_MAX_BINS = 10_000_000

_NAN = float("nan")


def worker_node(worker: str | None) -> str | None:
    """The node part of a worker slot id ``"<node>:<function>#<slot>"`` (text before the first
    ``':'``); ``None`` stays ``None``."""
    if worker is None:
        return None
    return worker.split(":", 1)[0]


# ---------------------------------------------------------------------------------------------
# normalisation


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _num(value: Any) -> float:
    if _missing(value) or value is pd.NaT:
        return _NAN
    if isinstance(value, pd.Timestamp):  # live frames carry instants (UTC) and Timedeltas
        return float(value.timestamp())
    if isinstance(value, pd.Timedelta):
        return float(value.total_seconds())
    return float(value)


def _frame(schema: Mapping[str, Any], columns: Mapping[str, Any]) -> pd.DataFrame:
    """A DataFrame with exactly ``schema``'s columns, order and dtypes (absent columns empty)."""
    return pd.DataFrame({
        name: pd.Series(columns.get(name, []), dtype=dtype) for name, dtype in schema.items()
    })


def _from_rows(schema: Mapping[str, Any], rows: list[tuple[Any, ...]]) -> pd.DataFrame:
    columns = zip(*rows, strict=True) if rows else ([] for _ in schema)
    return _frame(schema, dict(zip(schema, columns, strict=True)))


def _base_from_items(items: Iterable[Any]) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {name: [] for name in _BASE_COLUMNS}
    cols = [out[name] for name in _BASE_COLUMNS]
    rec: tuple[Any, ...]
    for item in items:
        if isinstance(item, JobEvent):
            rec = (item.t, item.node, item.queue, item.job_id, item.kind, item.attempt,
                   item.worker, item.detail)
        elif isinstance(item, Mapping):
            if "t" not in item or "kind" not in item:
                raise ConfigError(f"event mapping needs at least 't' and 'kind': {item!r}")
            rec = (item["t"], item.get("node", ""), item.get("queue", ""), item.get("job_id", ""),
                   item["kind"], item.get("attempt", 0), item.get("worker"), item.get("detail"))
        else:
            raise TypeError(f"expected JobEvent or mapping, got {type(item).__name__}")
        for col, value in zip(cols, rec, strict=True):
            col.append(value)
    return out


def _base_from_frame(df: pd.DataFrame) -> dict[str, list[Any]]:
    missing = {"t", "kind"} - set(df.columns)
    if missing:
        raise ConfigError(f"events DataFrame lacks column(s) {sorted(missing)}")
    defaults = {"node": "", "queue": "", "job_id": "", "attempt": 0, "worker": None}
    out = {}
    for name in _BASE_COLUMNS:
        out[name] = df[name].tolist() if name in df.columns else [defaults.get(name)] * len(df)
    # Flattened detail columns win where present; the dict column fills the gaps.
    for name in _FLAT_FIELDS:
        if name in df.columns:
            out[name] = df[name].tolist()
    return out


def _normalise(cols: dict[str, list[Any]]) -> dict[str, list[Any]]:
    details = [d if isinstance(d, Mapping) else {} for d in cols["detail"]]
    out: dict[str, list[Any]] = {
        "t": [_num(t) for t in cols["t"]],
        "node": [None if _missing(v) else v for v in cols["node"]],
        "queue": [None if _missing(v) else v for v in cols["queue"]],
        "job_id": ["" if _missing(v) else v for v in cols["job_id"]],
        "kind": cols["kind"],
        "attempt": [0 if _missing(v) else int(v) for v in cols["attempt"]],
        "worker": [None if _missing(v) else v for v in cols["worker"]],
        "detail": [dict(d) for d in details],
    }
    for name in _FLAT_FIELDS:
        given = cols.get(name)
        values = [
            d.get(name) if given is None or _missing(given[i]) else given[i]
            for i, d in enumerate(details)
        ]
        if name == "error":
            out[name] = [None if _missing(v) else str(v) for v in values]
        elif name == "priority":
            out[name] = [None if _missing(v) else int(v) for v in values]  # type: ignore[arg-type]
        else:
            out[name] = [_num(v) for v in values]
    return out


def _is_normalised(df: pd.DataFrame) -> bool:
    return (list(df.columns) == list(_EVENT_SCHEMA)
            and df.dtypes.astype(str).tolist() == _EVENT_DTYPE_NAMES
            and bool(df["t"].is_monotonic_increasing))


def events_frame(events: EventsLike) -> pd.DataFrame:
    """Normalise ``events`` into one row per event.

    Columns: t, node, queue, job_id, kind, attempt, worker (the slot id ``node:function#i``,
    as the event's field is named), detail, error, delay_s, ready_at, deadline, priority (the
    last five flattened from ``detail``; absent fields are None/NaN/NA).
    Rows are sorted stably by ``t``: events with equal ``t`` keep their input order, which is
    the order the owner emitted them. Passing an already normalised frame returns it cheaply.
    None and a DataFrame without rows (whatever its columns) count as no events. Raises
    TypeError for items that are neither JobEvent nor mapping, ConfigError (a ValueError) when an
    event lacks ``t`` or ``kind``.
    """
    if events is None or (isinstance(events, pd.DataFrame) and events.empty):
        return _frame(_EVENT_SCHEMA, {})
    if isinstance(events, pd.DataFrame):
        if _is_normalised(events):
            return events.reset_index(drop=True)
        base = _base_from_frame(events)
    else:
        base = _base_from_items(events)
    df = _frame(_EVENT_SCHEMA, _normalise(base))
    t = df["t"].to_numpy()
    if len(t) > 1 and not bool((t[1:] >= t[:-1]).all()):
        df = df.iloc[np.argsort(t, kind="stable")].reset_index(drop=True)
    return df


def _lists(df: pd.DataFrame, *names: str) -> list[list[Any]]:
    # Plain Python lists: a zip over them is several times faster than itertuples for 10k rows.
    return [df[name].tolist() for name in names]


def _target_state(kind: str, t: float, delay_s: float, ready_at: float) -> str | None:
    """The state a job enters on ``kind`` (None: no change). A delay whose ready_at is not in
    the future of the event counts as ready at once, so jobs and depth frames agree."""
    if kind in (ev.ENQUEUED, ev.RETRY_SCHEDULED, ev.UNBLOCKED):
        return "delayed" if delay_s > 0 and _ready_time(t, delay_s, ready_at) > t else "ready"
    if kind == ev.UPDATED:  # a waiting job's new start (app.update, a debounce call), if any
        return None if math.isnan(ready_at) else "delayed" if ready_at > t else "ready"
    return _FIXED_STATE.get(kind)


def _ready_time(t: float, delay_s: float, ready_at: float) -> float:
    return t + delay_s if math.isnan(ready_at) else ready_at


# ---------------------------------------------------------------------------------------------
# per-job views


@dataclass(slots=True)
class _Job:
    job_id: str
    queue: str | None
    state: str = "ready"
    ready_at: float = _NAN
    attempts: int = 0
    deliveries: int = 0
    enqueued_at: float = _NAN
    finished_at: float = _NAN
    last_error: str | None = None
    priority: int | None = None
    acks: int = 0
    progress: float = _NAN
    progress_note: str | None = None


def _apply(job: _Job, t: float, kind: str, row: tuple[Any, ...]) -> None:
    attempt, error, delay_s, ready_at, priority, detail = row
    if kind == ev.PROGRESS:  # the holder's latest ctx.progress(); the state does not change
        detail = detail if isinstance(detail, dict) else {}
        job.progress, job.progress_note = _num(detail.get("progress")), detail.get("note")
        return
    job.attempts = max(job.attempts, attempt)
    if kind in (ev.ENQUEUED, ev.WAITING):
        if math.isnan(job.enqueued_at):
            job.enqueued_at = t
        job.priority = priority
    elif kind == ev.CLAIMED:
        job.deliveries += 1
    elif kind == ev.ACKED:
        job.acks += 1
    # The first terminal event is when the job finished; a late second ack changes nothing.
    if kind in (ev.ACKED, ev.DEAD_LETTERED, ev.CANCELLED) and math.isnan(job.finished_at):
        job.finished_at = t
    if error is not None:
        job.last_error = error
    state = _target_state(kind, t, delay_s, ready_at)
    if state is not None:
        job.state = state
        job.ready_at = _ready_time(t, delay_s, ready_at) if state == "delayed" else _NAN


def jobs_frame(events: EventsLike) -> pd.DataFrame:
    """One row per job_id, in order of first appearance.

    Columns: job_id, queue, state, attempts (max attempt seen), deliveries (claimed events),
    enqueued_at, finished_at (first acked or dead_lettered, else NaN), last_error (last non-null
    error), priority, acks (acked events), duplicated (acks > 1: the job ran to completion more
    than once, e.g. a redelivery after a lost ack).

    ``state`` is the state after the job's last event: ready, delayed, leased, done, dead,
    cancelled, purged, expired or waiting (for its parents, ``after=``; ``depth_frame`` counts
    them in its ``waiting`` column). ``delayed`` means a pending delay/retry whose ready_at is after
    the last event of the whole stream; once that time has passed the job counts as ready.
    progress and progress_note: the latest ``progress`` event (a holder's ``ctx.progress()``;
    NaN/None without one). A job first
    seen through ``duplicate_enqueue`` (a live stream joined late) is assumed ready.
    """
    df = events_frame(events)
    jobs: dict[str, _Job] = {}
    ts, ids, queues, kinds, *rest = _lists(
        df, "t", "job_id", "queue", "kind", "attempt", "error", "delay_s", "ready_at", "priority",
        "detail")
    for t, job_id, queue, kind, *row in zip(ts, ids, queues, kinds, *rest, strict=True):
        if not job_id or kind not in _JOB_KINDS:
            continue
        job = jobs.get(job_id)
        if job is None:
            job = jobs[job_id] = _Job(job_id, queue)
        _apply(job, t, kind, tuple(row))
    t_end = ts[-1] if ts else _NAN
    rows = []
    for j in jobs.values():
        state = "ready" if j.state == "delayed" and not j.ready_at > t_end else j.state
        rows.append((j.job_id, j.queue, state, j.attempts, j.deliveries, j.enqueued_at,
                     j.finished_at, j.last_error, j.priority, j.acks, j.acks > 1, j.progress,
                     j.progress_note))
    return _from_rows(_JOB_SCHEMA, rows)


def _deliveries(df: pd.DataFrame) -> list[list[Any]]:
    """One mutable row per claimed event: [job_id, queue, attempt, worker, node, start, end,
    deadline, outcome, error, backoff_s, index of the job's previous delivery or -1,
    renewals]."""
    rows: list[list[Any]] = []
    open_: dict[tuple[str, int], int] = {}
    last_delivery: dict[str, int] = {}
    pending_backoff: dict[str, float] = {}
    cols = _lists(df, "t", "job_id", "queue", "kind", "attempt", "worker", "error", "delay_s",
                  "deadline")
    for t, job_id, queue, kind, attempt, worker, error, delay_s, deadline in zip(
            *cols, strict=True):
        if not job_id:
            continue
        if kind == ev.CLAIMED:
            backoff = pending_backoff.pop(job_id, _NAN)
            rows.append([job_id, queue, attempt, worker, worker_node(worker), t, _NAN, deadline,
                         "open", None, backoff if attempt > 1 else _NAN,
                         last_delivery.get(job_id, -1), 0])
            open_[(job_id, attempt)] = last_delivery[job_id] = len(rows) - 1
        elif kind in _LEASE_CLOSE:
            # Only the first close counts: a late ack for a lease that already expired does
            # not rewrite history (jobs_frame counts it as a second ack instead).
            idx = open_.pop((job_id, attempt), None)
            if idx is not None:
                rows[idx][6], rows[idx][8], rows[idx][9] = t, _LEASE_CLOSE[kind], error
        elif kind == ev.RETRY_SCHEDULED:
            pending_backoff[job_id] = delay_s
        elif kind == ev.LEASE_EXTENDED:  # a heartbeat moved the open lease's deadline
            idx = open_.get((job_id, attempt))
            if idx is not None:
                rows[idx][7] = deadline
                rows[idx][12] += 1
        elif kind == ev.CANCELLED:  # the lease this ended (by nack or expiry) was cancelled
            idx = last_delivery.get(job_id)
            if idx is not None and rows[idx][2] == attempt and rows[idx][6] == t \
                    and rows[idx][8] != "acked":
                rows[idx][8] = "cancelled"
    return rows


def leases_frame(events: EventsLike) -> pd.DataFrame:
    """One row per claimed event, in claim order.

    Columns: job_id, queue, attempt, worker (the slot id), node (its text before ':'), start
    (claim t), end (t of the acked/nacked/lease_expired with the same job_id and attempt; NaN
    while open), deadline (the latest: heartbeats move it), outcome ("acked", "nacked", "expired",
    "cancelled" or "open"), error (the nack's error), renewals (lease_extended events).
    """
    rows = [(*r[:10], r[12]) for r in _deliveries(events_frame(events))]
    return _from_rows(_LEASE_SCHEMA, rows)


def attempts_frame(events: EventsLike) -> pd.DataFrame:
    """One row per delivery, in claim order.

    Columns: job_id, attempt, claimed_at, finished_at (NaN while open), outcome, error,
    backoff_s (delay_s of the retry_scheduled that preceded this delivery; NaN for attempt 1 or
    when none was seen), waited_s (claimed_at minus the previous delivery's finished_at; NaN for
    attempt 1 or when that delivery never closed).
    """
    rows = _deliveries(events_frame(events))
    out = []
    for r in rows:
        prev = r[11]
        waited = r[5] - rows[prev][6] if r[2] > 1 and prev >= 0 else _NAN
        out.append((r[0], r[2], r[5], r[6], r[8], r[9], r[10], waited))
    return _from_rows(_ATTEMPT_SCHEMA, out)


# ---------------------------------------------------------------------------------------------
# queue-level views


def _mark(rows: list[tuple[Any, ...]], t: float, counts: dict[str, int]) -> None:
    """Record the counts at ``t``: collapse same-time changes into one row, drop no-op rows."""
    snap = tuple(counts[s] for s in _DEPTH_STATES)
    if rows and rows[-1][0] == t:
        rows.pop()
    before = rows[-1][1:] if rows else (0,) * len(_DEPTH_STATES)
    if snap != before:
        rows.append((t, *snap))


def depth_frame(events: EventsLike) -> pd.DataFrame:
    """Queue depth by state as a step series: one row per time at which any count changes.

    Columns: t, ready, leased, delayed, dead, done, waiting (counts over all queues in the
    stream; waiting: jobs enqueued with ``after=`` whose parents have not released them). The
    implicit delayed -> ready transitions at ready_at times appear as rows of their own; delays
    that end after the last event stay delayed. Purged and result-expired jobs leave dead/done.
    The final row agrees with ``jobs_frame(...).state`` counts.
    """
    df = events_frame(events)
    counts = dict.fromkeys(_DEPTH_STATES, 0)
    state: dict[str, str] = {}
    version: dict[str, int] = {}
    heap: list[tuple[float, int, str, int]] = []
    rows: list[tuple[Any, ...]] = []
    now = -math.inf
    pushed = 0

    def move(job_id: str, new: str) -> None:
        old = state.get(job_id)
        if old in counts:
            counts[old] -= 1
        state[job_id] = new
        if new in counts:
            counts[new] += 1

    for t, job_id, kind, delay_s, ready_at in zip(
            *_lists(df, "t", "job_id", "kind", "delay_s", "ready_at"), strict=True):
        # A heap entry is stale if the job moved on (version bumped) before its ready_at.
        while heap and heap[0][0] <= t:
            due, _, jid, ver = heapq.heappop(heap)
            if version[jid] == ver and state[jid] == "delayed":
                move(jid, "ready")
                _mark(rows, max(due, now), counts)
        now = t
        if not job_id or kind not in _JOB_KINDS:
            continue
        new = _target_state(kind, t, delay_s, ready_at)
        if kind == ev.DUPLICATE_ENQUEUE and job_id not in state:
            new = "ready"
        if new is None:
            continue
        move(job_id, new)
        version[job_id] = version.get(job_id, 0) + 1
        if new == "delayed":
            # The push sequence breaks ready_at ties in emission order, never by job id.
            pushed += 1
            heapq.heappush(heap, (_ready_time(t, delay_s, ready_at), pushed, job_id,
                                  version[job_id]))
        _mark(rows, t, counts)
    return _from_rows(_DEPTH_SCHEMA, rows)


def throughput_frame(events: EventsLike, bin_s: float = 1.0) -> pd.DataFrame:
    """Event counts per time bin.

    Columns: t (bin start, a multiple of ``bin_s`` so successive windows of a live stream bin
    alike), acked, nacked, expired (lease_expired), dead_lettered, enqueued. Bins run without
    gaps from the first event's bin to the last's. Raises ConfigError (a ValueError) if
    ``bin_s`` is not positive or the span would need more than ten million bins.
    """
    if not bin_s > 0:
        raise ConfigError(f"bin_s must be positive, got {bin_s!r}")
    df = events_frame(events)
    if df.empty:
        return _frame(_THROUGHPUT_SCHEMA, {})
    # Rounding first keeps t=0.3, bin_s=0.1 in bin 3 instead of 2.999... -> bin 2.
    idx = np.floor(np.round(df["t"].to_numpy() / bin_s, 9)).astype(np.int64)
    lo, hi = int(idx.min()), int(idx.max())
    if hi - lo >= _MAX_BINS:
        raise ConfigError(f"bin_s={bin_s} gives {hi - lo + 1} bins; use a larger bin")
    kinds = df["kind"].to_numpy()
    out: dict[str, Any] = {"t": np.arange(lo, hi + 1) * float(bin_s)}
    for col, kind in (("acked", ev.ACKED), ("nacked", ev.NACKED), ("expired", ev.LEASE_EXPIRED),
                      ("dead_lettered", ev.DEAD_LETTERED), ("enqueued", ev.ENQUEUED)):
        out[col] = np.bincount(idx[kinds == kind] - lo, minlength=hi - lo + 1)
    return _frame(_THROUGHPUT_SCHEMA, out)


def node_events_frame(events: EventsLike) -> pd.DataFrame:
    """The node-level rows (crashed, restarted) in time order. Columns: t, node, kind."""
    df = events_frame(events)
    sel = df[df["kind"].isin([ev.CRASHED, ev.RESTARTED])]
    return _frame(_NODE_EVENT_SCHEMA, {c: sel[c].tolist() for c in _NODE_EVENT_SCHEMA})
