"""Time series of one queue, kept by whoever sees its events (the owner, or a simulation's
event log): bounded time buckets, pure (no clock reads, no I/O).

One concept at three layers: the pure series here, the owner's op that serves it in
``owner/views/series.py``, its DataFrame shape in ``istos_nb/data/series.py``.

Two resolutions: :data:`FINE_S` (1 s) buckets for the last :data:`FINE_N` (one hour) and
:data:`COARSE_S` (1 min) buckets for the last :data:`COARSE_N` (one day). Only buckets in which
something happened are stored; a row for a quiet bucket repeats the counts before it with zero
events (see :meth:`Series.rows`). Each bucket holds

- ``counts``: jobs by state at the bucket's end (the owner's own counts, as of its last event);
- ``events``: enqueued, claimed, acked, nacked, expired (leases), dead-lettered and cancelled
  in the bucket;
- wait (ready -> claimed) and run (claimed -> settled) times as log histograms of
  :data:`BINS_PER_OCTAVE` bins per doubling, so the p50/p95/p99 read from them are within
  ~9% of the exact quantile (the bin's geometric middle).

Memory: a stored bucket is about 1.5 KB at most (two histograms of <= 40 busy bins, two small
lists); a full hour of busy seconds and a day of busy minutes are ~5,000 buckets, ~7 MB at the
very worst, and far less for a quiet queue. Claim times of jobs leased right now are kept too
(one float per live lease) so run times can be measured.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .. import events as ev

FINE_S, FINE_N = 1.0, 3600
COARSE_S, COARSE_N = 60.0, 1440
RESOLUTIONS = (FINE_S, COARSE_S)
STATE_COLUMNS = ("ready", "delayed", "leased", "done", "dead", "cancelled", "waiting")
EVENT_COLUMNS = ("enqueued", "claimed", "acked", "nacked", "expired", "dead_lettered",
                 "cancelled_n")
QUANTILES = (50, 95, 99)
TIME_COLUMNS = tuple(f"{what}_p{q}_s" for what in ("wait", "run") for q in QUANTILES)
COLUMNS = ("t", *STATE_COLUMNS, *EVENT_COLUMNS, *TIME_COLUMNS)
"""The fields of one series row: ``t`` the bucket's start (epoch seconds), counts at its end,
events in it, then wait and run quantiles in seconds (None when nothing was measured)."""

BINS_PER_OCTAVE = 4
_MIN_S = 1e-4  # durations below 0.1 ms share the first bin
_EVENT_INDEX = {ev.ENQUEUED: 0, ev.CLAIMED: 1, ev.ACKED: 2, ev.NACKED: 3, ev.LEASE_EXPIRED: 4,
                ev.DEAD_LETTERED: 5, ev.CANCELLED: 6}
_SETTLED = frozenset((ev.ACKED, ev.NACKED, ev.LEASE_EXPIRED, ev.CANCELLED))


def _bin(seconds: float) -> int:
    # log2 of a duration at or below _MIN_S is <= 0: the first bin. Above it the log is
    # positive, so int() is its floor.
    if seconds <= _MIN_S:
        return 0
    return int(BINS_PER_OCTAVE * math.log2(seconds / _MIN_S))


def _bin_middle(b: int) -> float:
    return _MIN_S * 2.0 ** ((b + 0.5) / BINS_PER_OCTAVE)


def quantile(hist: Mapping[int, int], q: float) -> float | None:
    """The ``q``-th percentile (0..100) of a log histogram; None when it is empty."""
    total = sum(hist.values())
    if not total:
        return None
    rank = q / 100.0 * total
    seen = 0
    for b in sorted(hist):
        seen += hist[b]
        if seen >= rank:
            return _bin_middle(b)
    return _bin_middle(max(hist))


class Bucket:
    __slots__ = ("t", "counts", "events", "wait", "run")

    def __init__(self, t: float, counts: tuple[int, ...]) -> None:
        self.t = t
        self.counts = counts
        self.events = [0] * len(EVENT_COLUMNS)
        self.wait: dict[int, int] = {}
        self.run: dict[int, int] = {}

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {"t": self.t}
        out.update(zip(STATE_COLUMNS, self.counts))
        out.update(zip(EVENT_COLUMNS, self.events))
        for what, hist in (("wait", self.wait), ("run", self.run)):
            for q in QUANTILES:
                out[f"{what}_p{q}_s"] = quantile(hist, q)
        return out


class Series:
    """The buckets of one queue at both resolutions.

    Feed it every event of the queue (:meth:`observe`) and, after a batch of them, the counts
    the queue has now (:meth:`mark_counts`); read rows with :meth:`rows`. ``ready_at(job_id)``
    answers since when a job has been ready (None if unknown), for wait times.
    """

    def __init__(self, ready_at: Callable[[str], float | None],
                 counts: Mapping[Any, int] | None = None) -> None:
        self._ready_at = ready_at
        self._rings: dict[float, deque[Bucket]] = {
            FINE_S: deque(maxlen=FINE_N), COARSE_S: deque(maxlen=COARSE_N)}
        self._claimed_at: dict[str, float] = {}
        self._counts = self._tuple(counts or {})
        self.started_at: float | None = None
        self._span = (math.inf, -math.inf)  # [start, end) the _current buckets cover
        self._current: list[Bucket] = []

    @staticmethod
    def _tuple(counts: Mapping[Any, int]) -> tuple[int, ...]:
        return tuple(int(counts.get(s, 0)) for s in STATE_COLUMNS)

    def _buckets(self, t: float) -> list[Bucket]:
        # The common case: the same second as the last event (one compare, no floor).
        if self._span[0] <= t < self._span[1]:
            return self._current
        out = []
        for res, ring in self._rings.items():
            start = math.floor(t / res) * res
            if not ring or ring[-1].t < start:
                ring.append(Bucket(start, self._counts))
            out.append(ring[-1])  # an event older than the newest bucket joins that one
        fine = out[0].t
        coarse_end = out[1].t + COARSE_S
        self._span = (fine, min(fine + FINE_S, coarse_end)) if out[0] is self._rings[
            FINE_S][-1] and fine <= t else (math.inf, -math.inf)
        self._current = out
        return out

    def observe(self, event: ev.JobEvent) -> None:
        """Count one event of this queue (in time order, as the owner emits them)."""
        index = _EVENT_INDEX.get(event.kind)
        if index is None:
            return
        if self.started_at is None:
            self.started_at = event.t
        buckets = self._buckets(event.t)
        if event.kind == ev.CLAIMED:
            since = self._ready_at(event.job_id)
            self._claimed_at[event.job_id] = event.t
            if since is not None:  # each histogram bin is worked out once, not per bucket
                k = _bin(event.t - since)
                for b in buckets:
                    b.events[index] += 1
                    b.wait[k] = b.wait.get(k, 0) + 1
                return
        elif event.kind in _SETTLED:
            claimed = self._claimed_at.pop(event.job_id, None)
            if claimed is not None:
                k = _bin(event.t - claimed)
                for b in buckets:
                    b.events[index] += 1
                    b.run[k] = b.run.get(k, 0) + 1
                return
        for b in buckets:
            b.events[index] += 1

    def mark_counts(self, t: float, counts: Mapping[Any, int]) -> None:
        """The queue's counts now (``t``): the newest buckets end with them."""
        self._counts = self._tuple(counts)
        for b in self._buckets(t):
            b.counts = self._counts

    def rows(self, since: float | None, until: float, resolution: float = FINE_S
             ) -> Iterator[dict[str, Any]]:
        """One row per bucket from ``since`` (default: the oldest kept) up to the bucket of
        ``until`` (now), dense: a quiet bucket repeats the counts before it with no events."""
        ring = self._rings[resolution]
        if not ring:
            return
        first = ring[0].t if since is None else max(ring[0].t,
                                                    math.floor(since / resolution) * resolution)
        last = math.floor(until / resolution) * resolution
        stored = iter(ring)
        nxt = next(stored, None)
        counts = ring[0].counts
        t = first
        while t <= last:
            while nxt is not None and nxt.t < t:
                counts = nxt.counts
                nxt = next(stored, None)
            if nxt is not None and nxt.t == t:
                counts = nxt.counts
                yield nxt.row()
                nxt = next(stored, None)
            else:
                quiet = Bucket(t, counts)
                yield quiet.row()
            t += resolution

    def forget(self, job_id: str) -> None:
        """``job_id`` left the queue without a settle event (purged, expired)."""
        self._claimed_at.pop(job_id, None)
