"""PURE: the English rendering of a parsed cron expression (:func:`istos.core.cron.describe`)."""

from __future__ import annotations

from itertools import groupby
from typing import Protocol


class CronSpec(Protocol):
    """The fields of a parsed expression (:class:`istos.core.cron.CronSpec`) a description
    reads (a protocol: cron.py imports this module)."""

    @property
    def minutes(self) -> frozenset[int]: ...
    @property
    def hours(self) -> frozenset[int]: ...
    @property
    def days(self) -> frozenset[int]: ...
    @property
    def months(self) -> frozenset[int]: ...
    @property
    def weekdays(self) -> frozenset[int]: ...
    @property
    def union_days(self) -> bool: ...

MONTH_NAMES = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")
DAY_NAMES = ("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT")


def describe(spec: CronSpec) -> str:
    """A short English rendering, e.g. ``at 09:00, on MON-FRI``. For people, not for parsing."""
    parts = [_describe_time(spec), _describe_days(spec)]
    if len(spec.months) < 12:
        parts.append("in " + format_values(spec.months, MONTH_NAMES, first=1))
    return ", ".join(parts)


def format_values(
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
    minutes = "every minute" if every_minute else f"at minute {format_values(spec.minutes)}"
    hours = "" if every_hour else f" of hour {format_values(spec.hours)}"
    return minutes + hours


def _describe_days(spec: CronSpec) -> str:
    dom = f"on day {format_values(spec.days)} of the month"
    dow = f"on {format_values(spec.weekdays, DAY_NAMES)}"
    if spec.union_days:
        return f"{dom} or {dow}"
    all_days, all_weekdays = len(spec.days) == 31, len(spec.weekdays) == 7
    if all_weekdays:
        return "every day" if all_days else dom
    if all_days:
        return dow
    return f"{dom} if it is {format_values(spec.weekdays, DAY_NAMES)}"
