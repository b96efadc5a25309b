"""PURE: how cron's matching wall times become instants around DST changes (for cron.py).

Standard library only; PEP 495 semantics throughout. A wall time is a naive ``datetime``; it is
*skipped* when it lies in a spring-forward gap (neither fold round-trips), *repeated* when it
lies in a fall-back overlap (fold=0 and fold=1 name two different instants), else ordinary.

The two policies (Debian cron(8), see :mod:`istos.core.cron`) walk matching wall times with a
``next_wall(start)`` callable: the first matching whole-minute wall time at or after ``start``,
or None when there is none within the search horizon.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone, tzinfo

__all__ = ["ceil_minute", "end_of_gap", "first_instant", "next_fixed_time", "next_real_time",
           "overlap_of", "second_instant", "wall"]

NextWall = Callable[[datetime], "datetime | None"]


def wall(instant: datetime, zone: tzinfo) -> datetime:
    """The naive local wall time of an aware ``instant`` in ``zone``."""
    return instant.astimezone(zone).replace(tzinfo=None)


def ceil_minute(when: datetime) -> datetime:
    """``when`` rounded up to a whole minute (unchanged if it already is one)."""
    floor = when.replace(second=0, microsecond=0)
    return floor if floor == when else floor + timedelta(minutes=1)


def first_instant(local: datetime, zone: tzinfo) -> datetime | None:
    """The UTC instant of the first occurrence of wall time ``local``; None when it is skipped."""
    first = local.replace(tzinfo=zone, fold=0).astimezone(timezone.utc)
    return first if wall(first, zone) == local else None


def second_instant(local: datetime, zone: tzinfo) -> datetime:
    """The UTC instant of the second occurrence of a repeated wall time ``local`` (fold=1)."""
    return local.replace(tzinfo=zone, fold=1).astimezone(timezone.utc)


def end_of_gap(local: datetime, zone: tzinfo) -> datetime:
    """The first instant (UTC) whose local time is at or after ``local``, a skipped time."""
    # PEP 495: the two folds of a skipped time convert with the offsets before and after the
    # transition, so they bracket it: the earlier reads before the gap, the later after it.
    a = local.replace(tzinfo=zone, fold=0).astimezone(timezone.utc)
    b = local.replace(tzinfo=zone, fold=1).astimezone(timezone.utc)
    lo = min(a, b)
    return lo + timedelta(seconds=_first_second(lo, max(a, b), lambda t: wall(t, zone) >= local))


def overlap_of(instant: datetime, zone: tzinfo) -> tuple[datetime, datetime] | None:
    """The repeated wall-time range ``[start, end)`` that ``instant``'s local time lies in.

    None when the local time of ``instant`` occurs only once. ``start`` is the local time just
    after the fall-back transition, ``end`` the one just before it (exclusive).
    """
    local = wall(instant, zone)
    u0 = local.replace(tzinfo=zone, fold=0).astimezone(timezone.utc)
    u1 = local.replace(tzinfo=zone, fold=1).astimezone(timezone.utc)
    if u1 <= u0:  # one occurrence (a real instant's wall time is never skipped)
        return None
    offset = u0.astimezone(zone).utcoffset()
    seconds = _first_second(u0, u1, lambda t: t.astimezone(zone).utcoffset() != offset)
    start = wall(u0 + timedelta(seconds=seconds), zone)
    return start, start + (u1 - u0)


def _first_second(lo: datetime, hi: datetime, reached: Callable[[datetime], bool]) -> int:
    """The first whole second s in (0, hi - lo] at which ``reached(lo + s)`` holds (monotone)."""
    lo_s, hi_s = 0, int((hi - lo).total_seconds())
    while hi_s - lo_s > 1:  # transitions fall on whole seconds; ~12 steps for one hour
        mid = (lo_s + hi_s) // 2
        if reached(lo + timedelta(seconds=mid)):
            hi_s = mid
        else:
            lo_s = mid
    return hi_s


def next_fixed_time(next_wall: NextWall, after_utc: datetime, start: datetime,
                    zone: tzinfo) -> datetime | None:
    """Fixed-time policy: first occurrences only, a skipped time fires at the end of its gap.

    ``start`` is ``after_utc``'s local wall time cut to the minute (fold=0); both policies
    return the first instant strictly after ``after_utc``, in UTC, or None.

    The map from matching wall time to instant never decreases, so walking wall times forward
    from ``after``'s finds the first; only a wall time already passed (a fold=1 ``after`` in an
    overlap) or one coalesced into a gap's end can fail the ``> after`` test.
    """
    while True:
        candidate = next_wall(start)
        if candidate is None:
            return None
        instant = first_instant(candidate, zone) or end_of_gap(candidate, zone)
        if instant > after_utc:
            return instant
        start = candidate + timedelta(minutes=1)


def next_real_time(next_wall: NextWall, after_utc: datetime, start: datetime,
                   zone: tzinfo) -> datetime | None:
    """Real-time policy: every instant whose local wall time matches, both folds, no gap times.

    First occurrences increase with the wall time, and so do second occurrences, so each is a
    forward walk. A second occurrence can only come first when ``after`` itself lies in a
    repeated stretch (its wall time's first occurrence is past, its second is not), so the
    fold=1 walk covers only that stretch.
    """
    first = None
    probe = start
    while first is None:
        candidate = next_wall(probe)
        if candidate is None:
            break
        instant = first_instant(candidate, zone)
        if instant is None:  # skipped by a gap: resume at the first wall time after it
            probe = ceil_minute(wall(end_of_gap(candidate, zone), zone))
        elif instant <= after_utc:  # a fold=1 `after`: this first occurrence has passed
            probe = candidate + timedelta(minutes=1)
        else:
            first = instant
    overlap = overlap_of(after_utc, zone)
    if overlap is None:
        return first
    repeat_start, repeat_end = overlap
    probe = ceil_minute(repeat_start) if after_utc.astimezone(zone).fold == 0 else start
    while (candidate := next_wall(probe)) is not None and candidate < repeat_end:
        second = second_instant(candidate, zone)
        if second > after_utc:
            return second if first is None or second < first else first
        probe = candidate + timedelta(minutes=1)
    return first
