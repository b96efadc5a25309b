"""PURE: five-field cron expressions, and the next instant one fires.

Standard library only; no clock is read here: the caller passes ``after``.

Grammar (``minute hour day-of-month month day-of-week``, separated by whitespace):

* ``*`` every value; ``7`` a single value; ``1-5`` an inclusive range;
* ``*/15``, ``10-50/5`` every n-th value of the range; ``5/15`` means ``5-<max>/15``;
* ``1,15,30`` a list of any of the above;
* month names ``JAN``-``DEC`` and weekday names ``SUN``-``SAT``, any case, also in ranges
  (``MON-FRI``); day of week counts Sunday as 0 and also accepts 7 for Sunday, so ``FRI-SUN``
  and ``5-7`` both mean Friday, Saturday, Sunday;
* nicknames ``@hourly @daily @midnight @weekly @monthly @yearly @annually``.

Day matching follows Vixie cron: a day-field is *restricted* unless its text begins with ``*``.
When both day of month and day of week are restricted, a day matches if EITHER matches
(``0 0 13 * FRI`` fires on every 13th and on every Friday); otherwise a day must match both,
which means only the restricted one constrains. Like Vixie cron, ``*/2`` counts as unrestricted,
so ``0 0 */10 * MON`` fires on the 1st, 11th, 21st and 31st only when they fall on a Monday.

Time zones and DST (:func:`next_fire`): matching is done on the local wall clock of the zone.

* A local time skipped by a spring-forward gap fires at the first instant after the gap
  (``30 2 * * *`` on a day when 02:00 jumps to 03:00 fires at 03:00), so the run is not lost.
  Several skipped times coalesce into that single instant.
* A local time that occurs twice in a fall-back overlap fires ONCE, at its first occurrence
  (``fold=0``). This holds for frequent expressions too: ``*/30 * * * *`` fires at the first
  02:00 and 02:30 of a repeated 02:00-03:00 hour, not again in the second one, so that night has
  one 90-minute gap in real time.

Errors: every invalid expression raises :class:`~istos.errors.CronError` naming the bad field, e.g.
``cron field 'hour' in '0 25 * * *': 25 is out of range 0-23``. An expression whose day of month
no chosen month has (``0 0 30 2 *``) is rejected at parse time. Any expression that passes can be
shown to fire within one 400-year Gregorian cycle, which bounds the search in :func:`next_fire`.
"""

from __future__ import annotations

import calendar
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone, tzinfo
from itertools import groupby
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from istos.errors import ConfigError, CronError

__all__ = ["CronSpec", "describe", "next_fire", "parse"]

_MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
_DAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")
# Longest each month can be (February in a leap year): the parse-time "can never fire" test.
_MAX_DAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
# The Gregorian calendar repeats every 400 years (146097 days, a whole number of weeks), so any
# expression that fires at all fires within that window after any start.
_HORIZON_YEARS = 401

_NICKNAMES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}


@dataclass(frozen=True)
class _Field:
    name: str
    lo: int
    hi: int  # what `*` and open-ended ranges (`5/15`) reach
    hi_written: int  # the largest value accepted as written (7 = Sunday in day of week)
    names: Mapping[str, int]


_FIELDS = (
    _Field("minute", 0, 59, 59, {}),
    _Field("hour", 0, 23, 23, {}),
    _Field("day of month", 1, 31, 31, {}),
    _Field("month", 1, 12, 12, {n: i + 1 for i, n in enumerate(_MONTH_NAMES)}),
    _Field("day of week", 0, 6, 7, {n: i for i, n in enumerate(_DAY_NAMES)}),
)


@dataclass(frozen=True)
class CronSpec:
    """A parsed cron expression: the allowed values of each field.

    ``weekdays`` count Sunday as 0 (0-6). ``dom_restricted``/``dow_restricted`` record whether the
    day-of-month/day-of-week text did not begin with ``*``; when both are true a day matches if
    either field matches (Vixie union), otherwise it must match both. ``expr`` is the source text,
    used in messages only (two specs with the same values compare equal).

    Construction validates: every set non-empty and in range, and (unless the union rule applies)
    some chosen month long enough for some chosen day; otherwise :class:`CronError`.
    """

    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    dom_restricted: bool = False
    dow_restricted: bool = False
    expr: str = field(default="", compare=False)
    # Sorted copies for bisect, computed once.
    _sorted: tuple[tuple[int, ...], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        values = (self.minutes, self.hours, self.days, self.months, self.weekdays)
        for fld, allowed in zip(_FIELDS, values, strict=True):
            if not allowed:
                raise CronError(_field_message(fld, self.expr, "no value selected"))
            bad = [v for v in allowed if not fld.lo <= v <= fld.hi]
            if bad:
                msg = f"{min(bad)} is out of range {fld.lo}-{fld.hi}"
                raise CronError(_field_message(fld, self.expr, msg))
        if not self.union_days:
            longest = max(_MAX_DAYS[m] for m in self.months)
            if min(self.days) > longest:
                months = _format_values(self.months, _MONTH_NAMES, first=1)
                msg = f"day {min(self.days)} never occurs in {months}, so it can never fire"
                raise CronError(_field_message(_FIELDS[2], self.expr, msg))
        object.__setattr__(self, "_sorted", tuple(tuple(sorted(v)) for v in values))

    @property
    def union_days(self) -> bool:
        """True when a day matches if day of month OR day of week matches (both restricted)."""
        return self.dom_restricted and self.dow_restricted

    def day_matches(self, year: int, month: int, day: int) -> bool:
        """Whether the calendar date satisfies the day-of-month/day-of-week rule (not month)."""
        weekday = (date(year, month, day).weekday() + 1) % 7  # Python's Monday=0 -> cron's Sunday=0
        return self._day_ok(day, weekday)

    def matches(self, when: datetime) -> bool:
        """Whether ``when``'s own wall-clock fields (seconds ignored) satisfy every field."""
        return (
            when.minute in self.minutes
            and when.hour in self.hours
            and when.month in self.months
            and self.day_matches(when.year, when.month, when.day)
        )

    def _day_ok(self, day: int, weekday: int) -> bool:
        in_dom, in_dow = day in self.days, weekday in self.weekdays
        return (in_dom or in_dow) if self.union_days else (in_dom and in_dow)

    def _first_day(self, year: int, month: int, from_day: int) -> int | None:
        """The first matching day of this month at or after ``from_day``, or None."""
        length = calendar.monthrange(year, month)[1]
        if from_day > length:
            return None
        weekday = (date(year, month, from_day).weekday() + 1) % 7
        for day in range(from_day, length + 1):
            if self._day_ok(day, weekday):
                return day
            weekday = (weekday + 1) % 7
        return None


def parse(expr: str) -> CronSpec:
    """Parse a five-field cron expression (or a nickname such as ``@daily``).

    Raises :class:`CronError`, naming the field, for a wrong field count, an unknown name or
    garbage token, a value out of range, a range whose start exceeds its end, a step that is not a
    positive integer, an empty list item, or a day of month that none of the chosen months has.
    """
    if not isinstance(expr, str):
        raise TypeError(f"a cron expression must be a str, not {type(expr).__name__}")
    text = expr.strip()
    if text.startswith("@"):
        if text.lower() not in _NICKNAMES:
            known = " ".join(_NICKNAMES)
            raise CronError(f"unknown cron nickname {text!r}; expected one of: {known}")
        text = _NICKNAMES[text.lower()]
    parts = text.split()
    if len(parts) != 5:
        names = ", ".join(f.name for f in _FIELDS)
        raise CronError(
            f"cron expression '{expr}' has {len(parts)} fields; expected 5 fields ({names})"
        )
    sets = [_parse_field(part, fld, expr) for part, fld in zip(parts, _FIELDS, strict=True)]
    weekdays = frozenset(v % 7 for v in sets[4])  # 7 is another spelling of Sunday
    restricted = [not part.startswith("*") for part in parts]
    minutes, hours, days, months = sets[:4]
    return CronSpec(minutes, hours, days, months, weekdays, restricted[2], restricted[4],
                    expr=expr)


def next_fire(expr: str | CronSpec, after: datetime, tz: str | tzinfo | None = None) -> datetime:
    """The first instant strictly after ``after`` at which the expression fires.

    ``after`` must be timezone-aware (ValueError otherwise). Fields are matched on the local wall
    clock of ``tz`` (a zone name or a PEP 495 tzinfo such as ZoneInfo; default ``after.tzinfo``),
    with the DST policy in this module's docstring. The result is aware, in that zone, on a whole
    minute; a result in a repeated hour has ``fold=0``, and, per PEP 495, compares unequal (``==``)
    to datetimes of other zones, so convert to UTC before comparing. Raises CronError for an
    invalid expression, ConfigError for an unknown zone name.
    Cost is a few steps per month, day and hour skipped, never a minute-by-minute scan.
    """
    spec = expr if isinstance(expr, CronSpec) else parse(expr)
    if after.tzinfo is None or after.utcoffset() is None:
        raise ValueError(f"next_fire needs a timezone-aware datetime, got naive {after!r}")
    zone = _resolve_zone(tz, after)
    # Compare in UTC: aware datetimes sharing a tzinfo compare by wall time, ignoring fold.
    after_utc = after.astimezone(timezone.utc)
    wall = after.astimezone(zone).replace(tzinfo=None, fold=0, second=0, microsecond=0)
    # One year short of datetime's limit, so converting a candidate to UTC cannot overflow.
    last_year = min(wall.year + _HORIZON_YEARS, datetime.max.year - 1)
    while True:
        candidate = _next_wall(spec, wall, last_year)
        if candidate is None:
            raise CronError(f"cron expression '{spec.expr}' never fires after {after.isoformat()}")
        instant = _instant(candidate, zone)
        # Only a wall time already passed (fold=1 `after` in an overlap) or one coalesced into a
        # gap's end can fail this; the wall-to-instant map never decreases, so this is the first.
        if instant > after_utc:
            return instant.astimezone(zone)
        wall = candidate + timedelta(minutes=1)


def describe(expr: str | CronSpec) -> str:
    """A short English rendering, e.g. ``at 09:00, on MON-FRI``. For people, not for parsing."""
    spec = expr if isinstance(expr, CronSpec) else parse(expr)
    parts = [_describe_time(spec), _describe_days(spec)]
    if len(spec.months) < 12:
        parts.append("in " + _format_values(spec.months, _MONTH_NAMES, first=1))
    return ", ".join(parts)


# -- parsing helpers --


def _field_message(fld: _Field, expr: str, problem: str) -> str:
    return f"cron field '{fld.name}' in '{expr}': {problem}"


def _parse_field(text: str, fld: _Field, expr: str) -> frozenset[int]:
    values: set[int] = set()
    for item in text.split(","):
        if not item:
            raise CronError(_field_message(fld, expr, f"empty item in list {text!r}"))
        values.update(_parse_item(item, fld, expr))
    return frozenset(values)


def _parse_item(item: str, fld: _Field, expr: str) -> range:
    base, slash, step_text = item.partition("/")
    step = 1
    if slash:
        if not (step_text.isascii() and step_text.isdigit()) or int(step_text) == 0:
            msg = f"step {step_text!r} in {item!r} must be a positive integer"
            raise CronError(_field_message(fld, expr, msg))
        step = int(step_text)
    if base == "*":
        start, end = fld.lo, fld.hi
    elif "-" in base:
        first, _, last = base.partition("-")
        start = _parse_value(first, fld, expr, item)
        end = _parse_value(last, fld, expr, item)
        named_sunday = fld.hi_written > fld.hi and end == fld.lo and not last.isdigit()
        if named_sunday and start > end:
            end = fld.hi_written  # `FRI-SUN`: a Sunday closing a range is day 7, not day 0
        if start > end:
            msg = f"range {base!r} starts after it ends"
            raise CronError(_field_message(fld, expr, msg))
    else:
        start = _parse_value(base, fld, expr, item)
        end = max(fld.hi, start) if slash else start  # `5/15` means `5-<max>/15`; `7/2` is 7
    return range(start, end + 1, step)


def _parse_value(token: str, fld: _Field, expr: str, item: str) -> int:
    if token.isascii() and token.isdigit():
        value = int(token)
    elif token.upper() in fld.names:
        value = fld.names[token.upper()]
    else:
        what = "value" if token else "empty value"
        msg = f"{what} {token!r} in {item!r} is not a number" + (
            f" or one of {'/'.join(fld.names)}" if fld.names else ""
        )
        raise CronError(_field_message(fld, expr, msg))
    if not fld.lo <= value <= fld.hi_written:
        msg = f"{value} is out of range {fld.lo}-{fld.hi_written}"
        raise CronError(_field_message(fld, expr, msg))
    return value


# -- search helpers --


def _resolve_zone(tz: str | tzinfo | None, after: datetime) -> tzinfo:
    if tz is None:
        return after.tzinfo  # type: ignore[return-value]  # checked aware by the caller
    if isinstance(tz, tzinfo):
        return tz
    if isinstance(tz, str):
        try:
            return ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ConfigError(f"unknown time zone {tz!r} for a cron schedule") from exc
    raise TypeError(f"tz must be a zone name or a tzinfo, not {type(tz).__name__}")


def _at_least(values: tuple[int, ...], x: int) -> int | None:
    i = bisect_left(values, x)
    return values[i] if i < len(values) else None


def _next_wall(spec: CronSpec, start: datetime, last_year: int) -> datetime | None:
    """The first naive wall time at or after ``start`` (a whole minute) matching ``spec``.

    Works field by field from the largest: a month, day or hour that cannot match is skipped
    whole, and each smaller field restarts at its minimum. None past ``last_year``.
    """
    minutes, hours, _, months, _ = spec._sorted
    year, month, day, hour, minute = start.year, start.month, start.day, start.hour, start.minute
    while year <= last_year:
        m = _at_least(months, month)
        if m is None:
            year, month, day, hour, minute = year + 1, 1, 1, 0, 0
            continue
        if m != month:
            month, day, hour, minute = m, 1, 0, 0
        d = spec._first_day(year, month, day)
        if d is None:
            year, month = (year + 1, 1) if month == 12 else (year, month + 1)
            day, hour, minute = 1, 0, 0
            continue
        if d != day:
            day, hour, minute = d, 0, 0
        h = _at_least(hours, hour)
        if h is None:  # also hour == 24 after a carry: move to the next day
            day, hour, minute = day + 1, 0, 0
            continue
        if h != hour:
            hour, minute = h, 0
        mi = _at_least(minutes, minute)
        if mi is None:
            hour, minute = hour + 1, 0
            continue
        return datetime(year, month, day, hour, mi)
    return None


def _wall(instant: datetime, zone: tzinfo) -> datetime:
    return instant.astimezone(zone).replace(tzinfo=None)


def _instant(wall: datetime, zone: tzinfo) -> datetime:
    """The UTC instant a matching local ``wall`` time fires at, per the module's DST policy.

    fold=0 picks the first occurrence of a repeated time. A time that does not round-trip lies in
    a gap and fires when the gap ends. The map never decreases as ``wall`` increases.
    """
    first = wall.replace(tzinfo=zone, fold=0).astimezone(timezone.utc)
    if _wall(first, zone) == wall:
        return first
    return _end_of_gap(wall, zone)


def _end_of_gap(wall: datetime, zone: tzinfo) -> datetime:
    """The first instant whose local time is at or after ``wall``, a time inside a gap."""
    # PEP 495: the two folds of a gap time convert with the offsets before and after the
    # transition, so they bracket it: the earlier reads before the gap, the later after it.
    a = wall.replace(tzinfo=zone, fold=0).astimezone(timezone.utc)
    b = wall.replace(tzinfo=zone, fold=1).astimezone(timezone.utc)
    lo, hi = min(a, b), max(a, b)
    lo_s, hi_s = 0, int((hi - lo).total_seconds())
    while hi_s - lo_s > 1:  # transitions fall on whole seconds; ~12 steps for a one-hour gap
        mid = (lo_s + hi_s) // 2
        if _wall(lo + timedelta(seconds=mid), zone) >= wall:
            hi_s = mid
        else:
            lo_s = mid
    return lo + timedelta(seconds=hi_s)


# -- describe helpers --


def _format_values(
    values: frozenset[int], names: tuple[str, ...] | None = None, first: int = 0
) -> str:
    """``0,1,2,3,10`` -> ``0-3,10``; with ``names`` each value is shown by name."""

    def show(v: int) -> str:
        return names[v - first] if names else str(v)

    runs: list[str] = []
    # Consecutive values share (value - position), so each group is one run.
    for _, group in groupby(enumerate(sorted(values)), key=lambda pair: pair[1] - pair[0]):
        run = [show(v) for _, v in group]
        runs.append(f"{run[0]}-{run[-1]}" if len(run) > 2 else ",".join(run))
    return ",".join(runs)


def _describe_time(spec: CronSpec) -> str:
    every_minute, every_hour = len(spec.minutes) == 60, len(spec.hours) == 24
    if len(spec.minutes) == 1 and len(spec.hours) == 1:
        return f"at {min(spec.hours):02d}:{min(spec.minutes):02d}"
    minutes = "every minute" if every_minute else f"at minute {_format_values(spec.minutes)}"
    hours = "" if every_hour else f" of hour {_format_values(spec.hours)}"
    return minutes + hours


def _describe_days(spec: CronSpec) -> str:
    dom = f"on day {_format_values(spec.days)} of the month"
    dow = f"on {_format_values(spec.weekdays, _DAY_NAMES)}"
    if spec.union_days:
        return f"{dom} or {dow}"
    all_days, all_weekdays = len(spec.days) == 31, len(spec.weekdays) == 7
    if all_weekdays:
        return "every day" if all_days else dom
    if all_days:
        return dow
    return f"{dom} if it is {_format_values(spec.weekdays, _DAY_NAMES)}"
