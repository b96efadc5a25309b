"""PURE: five-field cron expressions, and the next instant one fires.

Standard library only; no clock is read here: the caller passes ``after``.

Grammar (``minute hour day-of-month month day-of-week``, separated by spaces and tabs):

* ``*`` every value; ``7`` a single value; ``1-5`` an inclusive range;
* ``*/15``, ``10-50/5`` every n-th value of the range; ``5/15`` means ``5-<max>/15`` (in day of
  week ``<max>`` is 7, as in ``1-7/2``: ``1/2`` is MON, WED, FRI, SUN);
* ``1,15,30`` a list of any of the above;
* month names ``JAN``-``DEC`` and weekday names ``SUN``-``SAT``, any ASCII case, also in ranges
  (``MON-FRI``); day of week counts Sunday as 0 and also accepts 7 for Sunday, so ``FRI-SUN``
  and ``5-7`` both mean Friday, Saturday, Sunday;
* nicknames ``@hourly @daily @midnight @weekly @monthly @yearly @annually``.

Strict, like crontab: only ASCII digits, ASCII names and ``* , - /`` inside a field, only spaces
and tabs between fields (no Unicode case folding: ``ſun`` is not ``SUN``; no NBSP, no other
Unicode space, no vertical tab). A number has at most 9 digits and a step at most the field's
span (``*/60`` in minutes, never ``*/90``); anything else is a :class:`CronError` naming the field.

Day matching follows Vixie cron: a day-field is *restricted* unless its text begins with ``*``.
When both day of month and day of week are restricted, a day matches if EITHER matches
(``0 0 13 * FRI`` fires on every 13th and on every Friday); otherwise a day must match both,
which means only the restricted one constrains. Like Vixie cron, ``*/2`` counts as unrestricted,
so ``0 0 */10 * MON`` fires on the 1st, 11th, 21st and 31st only when they fall on a Monday.

Time zones and DST (:func:`next_fire`) follow Debian's cron(8). Fields are matched on the local
wall clock of the zone, and the job's kind decides what a DST change does:

* **Fixed-time jobs**, whose minute AND hour fields both do not begin with ``*`` (``30 2 * * *``,
  ``0 9-17 * * *``, ``0,30 1 * * *``): a local time skipped by a spring-forward gap fires once at
  the first instant after the gap (``30 2 * * *`` on a day when 02:00 jumps to 03:00 fires at
  03:00), several skipped times coalescing into that one fire; a local time repeated by a
  fall-back overlap fires ONCE, at its first occurrence.
* **Wildcard jobs**, whose minute or hour field begins with ``*`` (``*``, ``*/15``; also
  ``@hourly``): scheduled in real time. A skipped local time does not exist, so it does not
  fire; a repeated one fires at both occurrences. So ``0 * * * *`` in Europe/Berlin on
  2024-10-27 fires at 02:00 CEST, 02:00 CET and 03:00 CET (every hour of real time);
  ``*/30 * * * *`` in America/New_York on 2024-11-03 fires 01:00 EDT, 01:30 EDT, 01:00 EST,
  01:30 EST, 02:00 EST (no hole); ``30 * * * *`` in Europe/Berlin on 2024-03-31 fires at 01:30
  CET and then 03:30 CEST (02:30 never happened, and no extra 03:00 fire).

Errors: every invalid expression raises :class:`~istos.errors.CronError` naming the bad field, e.g.
``cron field 'hour' in '0 25 * * *': 25 is out of range 0-23``. An expression whose day of month
no chosen month has (``0 0 30 2 *``) is rejected at parse time. Any expression that passes can be
shown to fire within one 400-year Gregorian cycle, which bounds the search in :func:`next_fire`.
"""

from __future__ import annotations

import calendar
import functools
import re
import string
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from istos.errors import ConfigError, CronError

from . import crondesc, crontz
from .crondesc import DAY_NAMES, MONTH_NAMES, format_values

__all__ = ["CronSpec", "describe", "next_fire", "parse"]

# Longest each month can be (February in a leap year): the parse-time "can never fire" test.
_MAX_DAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
# The Gregorian calendar repeats every 400 years (146097 days, a whole number of weeks), so any
# expression that fires at all fires within that window after any start.
_HORIZON_YEARS = 401
# crontab(5): fields are separated by spaces and tabs; str.split() would also take NBSP, U+3000...
_SEPARATORS = re.compile("[ \t]+")
_FIELD_CHARS = frozenset(string.ascii_letters + string.digits + "*,-/")
# Explicit ASCII case tables: str.upper() folds Unicode, turning 'ſun' (long s) into 'SUN'.
_TO_UPPER = str.maketrans(string.ascii_lowercase, string.ascii_uppercase)
_TO_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_MAX_DIGITS = 9  # far above any field's values; keeps int() away from 4,000-digit numerals
_LONG_NUMBER = re.compile(f"[0-9]{{{_MAX_DIGITS + 1},}}")
_MAX_FIELD_LEN = 500  # 60 minutes written out one by one take under 200

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
    _Field("month", 1, 12, 12, {n: i + 1 for i, n in enumerate(MONTH_NAMES)}),
    _Field("day of week", 0, 6, 7, {n: i for i, n in enumerate(DAY_NAMES)}),
)


@dataclass(frozen=True)
class CronSpec:
    """A parsed cron expression: the allowed values of each field.

    ``weekdays`` count Sunday as 0 (0-6). ``dom_restricted``/``dow_restricted`` record whether the
    day-of-month/day-of-week text did not begin with ``*``; when both are true a day matches if
    either field matches (Vixie union), otherwise it must match both. ``wildcard_time`` records
    whether the minute or hour text began with ``*``: such a job runs in real time across DST
    changes, a fixed-time one (False) by the gap/repeat policy (module docstring). ``expr`` is the
    source text, used in messages only (two specs with the same values compare equal).

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
    wildcard_time: bool = False
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
                months = format_values(self.months, MONTH_NAMES, first=1)
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

    Raises :class:`CronError`, naming the field, for a wrong field count, a character other than
    ASCII digits, letters and ``* , - /`` in a field (fields are separated by spaces and tabs
    only), an unknown name or garbage token, a number of more than 9 digits, a value out of
    range, a range whose start exceeds its end, a step that is not a positive integer up to the
    field's span, an empty list item, or a day of month that none of the chosen months has.
    """
    if not isinstance(expr, str):
        raise TypeError(f"a cron expression must be a str, not {type(expr).__name__}")
    text = expr.strip(" \t")
    if text.startswith("@"):
        key = text.translate(_TO_LOWER)
        if key not in _NICKNAMES:
            known = " ".join(_NICKNAMES)
            raise CronError(f"unknown cron nickname {text[:40]!r}; expected one of: {known}")
        text = _NICKNAMES[key]
    parts = _SEPARATORS.split(text) if text else []
    for index, part in enumerate(parts):
        _check_chars(part, index, expr)
    if len(parts) != 5:
        names = ", ".join(f.name for f in _FIELDS)
        raise CronError(
            f"cron expression {expr!r} has {len(parts)} fields; expected 5 fields ({names}) "
            "separated by spaces or tabs"
        )
    sets = [_parse_field(part, fld, expr) for part, fld in zip(parts, _FIELDS, strict=True)]
    weekdays = frozenset(v % 7 for v in sets[4])  # 7 is another spelling of Sunday
    restricted = [not part.startswith("*") for part in parts]
    minutes, hours, days, months = sets[:4]
    return CronSpec(minutes, hours, days, months, weekdays, restricted[2], restricted[4],
                    wildcard_time=not (restricted[0] and restricted[1]), expr=expr)


def next_fire(expr: str | CronSpec, after: datetime, tz: str | tzinfo | None = None) -> datetime:
    """The first instant strictly after ``after`` at which the expression fires.

    ``after`` must be timezone-aware (ValueError otherwise). Fields are matched on the local wall
    clock of ``tz`` (a zone name or a PEP 495 tzinfo such as ZoneInfo; default ``after.tzinfo``),
    with the DST rules in this module's docstring (fixed-time jobs: gap/repeat policy; wildcard
    jobs: real time). The result is aware, in that zone, on a whole local minute; its ``fold``
    tells the two occurrences of a repeated time apart (a fixed-time job always gets fold=0).
    Per PEP 495 a repeated local time compares unequal (``==``) to datetimes of other zones, so
    convert to UTC before comparing. Raises CronError for an invalid expression, ConfigError for
    an unknown zone name. Cost is a few steps per month, day and hour skipped, never a
    minute-by-minute scan.
    """
    spec = expr if isinstance(expr, CronSpec) else parse(expr)
    if after.tzinfo is None or after.utcoffset() is None:
        raise ValueError(f"next_fire needs a timezone-aware datetime, got naive {after!r}")
    zone = _resolve_zone(tz, after)
    # Compare in UTC: aware datetimes sharing a tzinfo compare by wall time, ignoring fold.
    after_utc = after.astimezone(timezone.utc)
    wall = crontz.wall(after_utc, zone).replace(fold=0, second=0, microsecond=0)
    # One year short of datetime's limit, so converting a candidate to UTC cannot overflow.
    last_year = min(wall.year + _HORIZON_YEARS, datetime.max.year - 1)
    policy = crontz.next_real_time if spec.wildcard_time else crontz.next_fixed_time
    found = policy(functools.partial(_next_wall, spec, last_year=last_year), after_utc, wall, zone)
    if found is None:
        raise CronError(f"cron expression '{spec.expr}' never fires after {after.isoformat()}")
    return found.astimezone(zone)


def describe(expr: str | CronSpec) -> str:
    """A short English rendering, e.g. ``at 09:00, on MON-FRI``. For people, not for parsing."""
    return crondesc.describe(expr if isinstance(expr, CronSpec) else parse(expr))


# -- parsing helpers --


def _field_message(fld: _Field, expr: str, problem: str) -> str:
    return f"cron field '{fld.name}' in {expr!r}: {problem}"


def _check_chars(part: str, index: int, expr: str) -> None:
    """Refuse what no field may hold, before anything is converted (messages name the field)."""
    what = None
    bad = next((ch for ch in part if ch not in _FIELD_CHARS), None)
    long_number = _LONG_NUMBER.search(part)
    if bad is not None:
        what = f"character {bad!r} (U+{ord(bad):04X}) is not allowed: a field holds ASCII " \
               "digits, names and * , - / only, and fields are separated by spaces or tabs"
    elif long_number is not None:
        digits = long_number.group()
        what = f"number {digits[:12]}... has {len(digits)} digits; the limit is {_MAX_DIGITS}"
    elif len(part) > _MAX_FIELD_LEN:
        what = f"{part[:20]!r}... is {len(part)} characters long; the limit is {_MAX_FIELD_LEN}"
    if what is None:
        return
    expr_shown = expr if len(expr) <= 80 else expr[:60] + "..."
    if index < len(_FIELDS):
        raise CronError(_field_message(_FIELDS[index], expr_shown, what))
    raise CronError(f"cron expression {expr_shown!r}: {what}")


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
        step = _parse_step(step_text, fld, expr, item)
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
        # `5/15` means `5-<max>/15` with the largest value as written (7 in day of week, so
        # `1/2` agrees with `1-7/2`); a plain `5` is just 5.
        end = fld.hi_written if slash else start
    return range(start, end + 1, step)


def _parse_step(text: str, fld: _Field, expr: str, item: str) -> int:
    span = fld.hi_written - fld.lo + 1
    if not text.isdigit() or not 0 < int(text) <= span:
        # A step beyond the span selects only the range's start: never what was meant.
        msg = f"step {text[:20]!r} in {item[:40]!r} must be an integer from 1 to {span}"
        raise CronError(_field_message(fld, expr, msg))
    return int(text)


def _parse_value(token: str, fld: _Field, expr: str, item: str) -> int:
    if token.isdigit():  # ASCII digits of at most _MAX_DIGITS: _check_chars ran first
        value = int(token)
    elif token.translate(_TO_UPPER) in fld.names:
        value = fld.names[token.translate(_TO_UPPER)]
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
