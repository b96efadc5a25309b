"""Differential test: istos.core.cron against cronsim (an independent Debian-cron model).

Seeded random expressions (numbers, names, ranges, steps, lists, 7 as Sunday) in several zones,
started at random instants and near DST transitions; the next fires must agree as UTC instants,
and both must accept or refuse the same expressions.

Cases where cronsim is known to be wrong are excluded BY RULE, each rule checked on the case
itself (never a list of examples):

1. ``a-a/n`` (a range whose start equals its end, with a step): cronsim reads a one-value range
   as ``a/n``, i.e. ``a-<max>/n``; the range holds one value, so the item is just ``a``.
2. A range closed by the name ``SUN`` after a later day (``FRI-SUN``): cronsim refuses it
   (SUN is 0 to it); crontab reads that Sunday as day 7.
3. A fixed-time expression (minute and hour not beginning with ``*``) started at the second
   occurrence of a repeated local time (fold=1): cronsim drops the fold and can return the
   first occurrence, an instant before the start.
4. cronsim returns a local time that does not exist (a day or month advance lands on midnight
   inside a gap, and it returns that wall time unchecked): the comparison stops at that fire.
5. A wildcard expression across a DST change that is not a whole hour (Australia/Lord_Howe
   shifts by 30 minutes): cronsim steps hours by adding 3600 s from the top of an hour (which
   may lie before the change), lands on :30 and misses the first half of a matching hour. The
   comparison stops at the first fire with such a change since an hour before the previous one.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

cronsim = pytest.importorskip("cronsim")

from istos.core.cron import next_fire, parse  # noqa: E402
from istos.errors import CronError  # noqa: E402

UTC = timezone.utc
ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Santiago",
         "Asia/Kolkata", "UTC"]
FIELDS = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 6)]
STAR_CHANCE = [0.3, 0.45, 0.6, 0.7, 0.6]
NAMES = {3: "JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split(),
         4: "SUN MON TUE WED THU FRI SAT".split()}
EXPRESSIONS = 3000
FIRES = 5


def _item(rng: random.Random, index: int) -> str:
    lo, hi = FIELDS[index]
    top = 7 if index == 4 else hi  # day of week also takes 7 (Sunday)
    a = rng.randint(lo, top - 1)
    b = rng.randint(a, top) if rng.random() < 0.2 else rng.randint(a + 1, top)
    step = rng.randint(1, (hi - lo) // 2 + 1)

    def show(v: int) -> str:
        names = NAMES.get(index)
        if names and rng.random() < 0.35:
            return names[(v - lo) % len(names)]
        return str(v) if rng.random() < 0.9 else f"0{v}"

    kind = rng.choice(["one", "one", "range", "range_step", "open_step", "star_step"])
    if kind == "one":
        return show(a)
    if kind == "range":
        return f"{show(a)}-{show(b)}"
    if kind == "range_step":
        return f"{show(a)}-{show(b)}/{step}"
    if kind == "open_step":
        return f"{show(a)}/{step}"
    return f"*/{step}"


def _expression(rng: random.Random) -> str:
    fields = []
    for index in range(5):
        if rng.random() < STAR_CHANCE[index]:
            fields.append("*")
        else:
            fields.append(",".join(_item(rng, index) for _ in range(rng.choice([1, 1, 2, 3]))))
    text = " ".join(fields)
    return text.lower() if rng.random() < 0.2 else text


def _excluded_by_syntax(expr: str) -> str | None:
    """Rules 1 and 2: items cronsim reads wrongly, judged on the text."""
    for index, field in enumerate(expr.upper().split()):
        for item in field.split(","):
            base, slash, _ = item.partition("/")
            if "-" not in base:
                continue
            first, _, last = base.partition("-")
            values = [_value(first, index), _value(last, index)]
            if slash and values[0] == values[1]:
                return "rule 1: a-a/n"
            if index == 4 and last == "SUN" and values[0] > 0:
                return "rule 2: range closed by SUN"
    return None


def _value(token: str, index: int) -> int:
    names = NAMES.get(index)
    if names and token in names:
        return names.index(token) + FIELDS[index][0]
    return int(token)


def _fixed_time(expr: str) -> bool:
    return not any(f.startswith("*") for f in expr.split()[:2])


def _exists(local: datetime) -> bool:
    return local.astimezone(UTC).astimezone(local.tzinfo).replace(tzinfo=None) == \
        local.replace(tzinfo=None)


def _excluded_by_result(expr: str, previous: datetime, expected: datetime) -> str | None:
    """Rules 4 and 5, judged on cronsim's answer."""
    if not _exists(expected):
        return "rule 4: cronsim returned a nonexistent time"
    offsets = {t.utcoffset() for t in (previous - timedelta(hours=1), previous, expected)}
    if not _fixed_time(expr) and any(
            (a - b).total_seconds() % 3600 for a in offsets for b in offsets):  # type: ignore[operator]
        return "rule 5: wildcard across a DST change of less than an hour"
    return None


def _transitions(zone: ZoneInfo) -> list[datetime]:
    """The zone's offset changes in 2021-2028, to the hour (scanned once per zone)."""
    out, probe = [], datetime(2021, 1, 1, tzinfo=UTC)
    offset = probe.astimezone(zone).utcoffset()
    while probe.year < 2029:
        probe += timedelta(hours=1)
        now = probe.astimezone(zone).utcoffset()
        if now != offset:
            out.append(probe)
            offset = now
    return out


def _start(rng: random.Random, zone: ZoneInfo, transitions: list[datetime]) -> datetime:
    base = datetime(2021, 1, 1, tzinfo=UTC) + timedelta(seconds=rng.randrange(8 * 365 * 86400))
    if transitions and rng.random() < 0.5:  # near a transition
        base = rng.choice(transitions) + timedelta(minutes=rng.randrange(-30 * 60, 6 * 60))
    return (base + timedelta(seconds=rng.choice([0, 0, rng.randrange(60)]))).astimezone(zone)


def test_agrees_with_cronsim() -> None:
    rng = random.Random(16_2026)
    compared = fires = 0
    skipped: dict[str, int] = {}
    transitions = {name: _transitions(ZoneInfo(name)) for name in ZONES}
    for _ in range(EXPRESSIONS):
        expr = _expression(rng)
        name = rng.choice(ZONES)
        zone = ZoneInfo(name)
        start = _start(rng, zone, transitions[name])
        rule = _excluded_by_syntax(expr)
        if rule is None and _fixed_time(expr) and start.fold == 1 \
                and start.replace(fold=0).utcoffset() != start.utcoffset():
            rule = "rule 3: fixed-time start at fold=1"
        if rule is not None:
            skipped[rule] = skipped.get(rule, 0) + 1
            continue
        try:
            spec = parse(expr)
        except CronError as exc:
            with pytest.raises(cronsim.CronSimError):
                cronsim.CronSim(expr, start)
            assert "never fire" in str(exc) or "range" in str(exc), (expr, exc)
            continue
        theirs = cronsim.CronSim(expr, start)
        ours = start
        for _ in range(FIRES):
            expected = next(theirs)
            rule = _excluded_by_result(expr, ours, expected)
            if rule is not None:
                skipped[rule] = skipped.get(rule, 0) + 1
                break
            ours = next_fire(spec, ours, zone)
            assert ours.astimezone(UTC) == expected.astimezone(UTC), (expr, str(zone), start)
            fires += 1
        compared += 1
    # The comparison must have covered most of the sample, and each rule must stay rare.
    print(f"compared {compared} expressions, {fires} fires; excluded: {skipped}")
    assert compared > EXPRESSIONS * 0.8, (compared, skipped)
    assert fires > compared * FIRES * 0.95
    assert all(n < EXPRESSIONS * 0.1 for n in skipped.values()), skipped
