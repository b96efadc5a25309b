"""Queue series as DataFrames: the owner's (``LiveQueue.series()``) and a simulation's
(``SimResult.series()``) in one shape, so one chart function draws both worlds.

One concept at three layers: the pure series is ``istos/core/series.py``, the owner's op
``istos/owner/views/series.py``, its DataFrame shape here.

One row per bucket, indexed by the bucket's start as a UTC ``DatetimeIndex`` (``t``):
counts by state at the bucket's end (ready, delayed, leased, done, dead, cancelled), events in
it (enqueued, claimed, acked, nacked, expired, dead_lettered, cancelled_n) and wait/run
quantiles as Timedeltas (wait_p50 ... run_p99; NaT when nothing was measured). See
:mod:`istos.core.series` for the buckets and their precision.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from istos import events as ev
from istos.core import series as S

__all__ = ["series_frame", "series_from_events", "SERIES_COLUMNS"]

SERIES_COLUMNS = (*S.STATE_COLUMNS, *S.EVENT_COLUMNS,
                  *(c[:-2] for c in S.TIME_COLUMNS))
"""The columns of a series frame, in order (its index is ``t``)."""


def series_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """Rows as the ``series`` op answers them (see :data:`istos.core.series.COLUMNS`)."""
    rows = list(rows)
    data: dict[str, Any] = {}
    for col in (*S.STATE_COLUMNS, *S.EVENT_COLUMNS):
        data[col] = pd.array([int(r.get(col) or 0) for r in rows], dtype="int64")
    for col in S.TIME_COLUMNS:
        data[col[:-2]] = pd.to_timedelta(
            [float("nan") if r.get(col) is None else float(r[col]) for r in rows], unit="s")
    index = pd.DatetimeIndex(pd.to_datetime([float(r["t"]) for r in rows], unit="s", utc=True),
                             name="t")
    return pd.DataFrame(data, index=index, columns=list(SERIES_COLUMNS))


def series_from_events(events: Iterable[Mapping[str, Any]], queue: str | None = None,
                       resolution_s: float = S.FINE_S, until: float | None = None
                       ) -> pd.DataFrame:
    """The series a queue's owner would have kept, from its complete event log (a
    simulation's): the same :class:`istos.core.series.Series`, with counts replayed from the
    events (``istos_nb.frames.depth_frame``) since no owner is there to ask."""
    from .frames import depth_frame

    mine = [e for e in events if e.get("job_id") and (queue is None or e.get("queue") == queue)]
    ready_at: dict[str, float] = {}

    def since(job_id: str) -> float | None:
        return ready_at.get(job_id)

    series = S.Series(since)
    depth = depth_frame(mine)
    depth_t = [float(t) for t in depth["t"]] if len(depth) else []
    have = [c for c in S.STATE_COLUMNS if c in depth.columns]
    depth_counts = [dict(zip(have, map(int, vals)))
                    for vals in zip(*(depth[c] for c in have))] if len(depth) else []
    for e in mine:
        kind, t, detail = e["kind"], float(e["t"]), e.get("detail") or {}
        if kind in (ev.ENQUEUED, ev.RETRY_SCHEDULED):
            ready_at[e["job_id"]] = float(detail.get("ready_at") or t)
        elif kind == ev.LEASE_EXPIRED:
            ready_at[e["job_id"]] = t
        series.observe(ev.JobEvent.from_dict({**e, "detail": detail}))
        i = bisect.bisect_right(depth_t, t) - 1
        if i >= 0:
            series.mark_counts(t, depth_counts[i])
    end = until if until is not None else (float(mine[-1]["t"]) if mine else 0.0)
    return series_frame(series.rows(None, end, resolution_s))
