"""Tests for istos.core.cron: parsing, next-fire tables, DST policy, errors, and a seeded
property check against independent brute-force references."""

from __future__ import annotations

import random
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest

from istos.core.cron import CronSpec, describe, next_fire, parse
from istos.errors import ConfigError, CronError

pytestmark = pytest.mark.fast  # `make check`: no process, server or session

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
LORD_HOWE = ZoneInfo("Australia/Lord_Howe")


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


# -- parsing --


def test_parse_sets_and_flags() -> None:
    spec = parse("*/15 9-17 1,15 JAN-mar mon-FRI")
    assert spec.minutes == {0, 15, 30, 45}
    assert spec.hours == set(range(9, 18))
    assert spec.days == {1, 15}
    assert spec.months == {1, 2, 3}
    assert spec.weekdays == {1, 2, 3, 4, 5}
    assert spec.dom_restricted and spec.dow_restricted


@pytest.mark.parametrize(
    ("field", "text", "expected"),
    [
        ("minute", "10-50/20", {10, 30, 50}),
        ("minute", "5/15", {5, 20, 35, 50}),
        ("minute", "1-3,*/20", {0, 1, 2, 3, 20, 40}),
        ("minute", "7", {7}),
        ("hour", "*/7", {0, 7, 14, 21}),
        ("day of week", "7", {0}),
        ("day of week", "5-7", {5, 6, 0}),
        ("day of week", "FRI-SUN", {5, 6, 0}),
        ("day of week", "SUN-SUN", {0}),
        ("day of week", "SUN-TUE", {0, 1, 2}),
        ("day of week", "0-7", set(range(7))),
        ("day of week", "*/2", {0, 2, 4, 6}),
        ("month", "jul,Dec", {7, 12}),
        ("month", "*", set(range(1, 13))),
    ],
)
def test_parse_field_forms(field: str, text: str, expected: set[int]) -> None:
    parts = ["0", "0", "*", "*", "*"]
    index = ["minute", "hour", "day of month", "month", "day of week"].index(field)
    parts[index] = text
    spec = parse(" ".join(parts))
    got = [spec.minutes, spec.hours, spec.days, spec.months, spec.weekdays][index]
    assert got == expected


def test_star_prefixed_day_fields_are_unrestricted() -> None:
    assert not parse("0 0 * * *").dom_restricted
    assert not parse("0 0 */2 * *").dom_restricted  # Vixie: text starting with '*'
    assert parse("0 0 1-31 * *").dom_restricted
    assert not parse("0 0 * * */2").dow_restricted


def test_nicknames_and_equality() -> None:
    assert parse("@daily") == parse("0 0 * * *") == parse("@midnight")
    assert parse("@HOURLY") == parse("0 * * * *")
    assert parse("@weekly") == parse("0 0 * * SUN") == parse("0 0 * * 7")
    assert parse("@yearly") == parse("@annually") == parse("0 0 1 JAN *")
    assert parse("@monthly").days == {1}
    assert parse("  0\t0  * * *  ") == parse("0 0 * * *")


def test_cron_spec_validates_direct_construction() -> None:
    full = frozenset(range(1, 32))
    with pytest.raises(CronError, match="'minute'"):
        CronSpec(frozenset(), frozenset({0}), full, frozenset({1}), frozenset({0}))
    with pytest.raises(CronError, match="'day of week'"):
        CronSpec(frozenset({0}), frozenset({0}), full, frozenset({1}), frozenset({7}))


@pytest.mark.parametrize(
    ("expr", "needle"),
    [
        ("0 25 * * *", "'hour'"),
        ("60 * * * *", "'minute'"),
        ("* * 0 * *", "'day of month'"),
        ("* * 32 * *", "'day of month'"),
        ("* * * 13 *", "'month'"),
        ("* * * 0 *", "'month'"),
        ("* * * * 8", "'day of week'"),
        ("5-1 * * * *", "'minute'"),
        ("* 20-3 * * *", "'hour'"),
        ("*/0 * * * *", "'minute'"),
        ("* */-5 * * *", "'hour'"),
        ("-5 * * * *", "'minute'"),
        ("1,,2 * * * *", "'minute'"),
        ("* * 1, * *", "'day of month'"),
        ("a * * * *", "'minute'"),
        ("* JAN * * *", "'hour'"),
        ("* * * FOO *", "'month'"),
        ("* * * */x *", "'month'"),
        ("* * * * MON-", "'day of week'"),
        ("* * * * SAT-MON", "'day of week'"),
        ("* * * * 6-0", "'day of week'"),
        ("1-2-3 * * * *", "'minute'"),
        ("0 0 ** * *", "'day of month'"),
        ("0 0 30 2 *", "'day of month'"),
        ("0 0 31 4,6,9,11 *", "'day of month'"),
        ("0 0 31 4 */2", "'day of month'"),
        ("* * * *", "5 fields"),
        ("* * * * * *", "5 fields"),
        ("", "5 fields"),
        ("@reboot", "nickname"),
    ],
)
def test_invalid_expressions_name_the_field(expr: str, needle: str) -> None:
    with pytest.raises(CronError) as info:
        parse(expr)
    assert needle in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("expr", "needle"),
    [
        ("0 0 * * \u017fun", "'day of week'"),  # long s: str.upper() would make it SUN
        ("0 0 * * fr\u0131", "'day of week'"),  # dotless i: FRI after Unicode case folding
        ("0 0 1 \u017fep *", "'month'"),
        ("0\u00a00 * * *", "'minute'"),  # NBSP
        ("0 0\u2003* * *", "'hour'"),  # EM SPACE
        ("0 0 *\u3000* *", "'day of month'"),  # IDEOGRAPHIC SPACE
        ("0\x0b0 * * *", "'minute'"),  # VT
        ("0 0\x0c* * *", "'hour'"),  # FF
        ("0 0 * *\u2028*", "'month'"),  # LINE SEPARATOR
        ("0 0 * * *\n", "'day of week'"),
        ("\uff11 * * * *", "'minute'"),  # FULLWIDTH DIGIT ONE
        ("0 " + "9" * 4400 + " * * *", "'hour'"),  # int() itself would refuse it, unnamed
        ("0 0 " + "0" * 10 + "1 * *", "'day of month'"),
        ("*/" + "1" * 30 + " * * * *", "'minute'"),
        ("*/61 * * * *", "'minute'"),
        ("0 */25 * * *", "'hour'"),
        ("0 0 * * */9", "'day of week'"),
        ("0 0 " + ",".join(["1"] * 300) + " * *", "'day of month'"),
        ("@hourl\u212a", "nickname"),  # KELVIN SIGN lower-cases to k
    ],
)
def test_strict_parsing_names_the_field(expr: str, needle: str) -> None:
    with pytest.raises(CronError) as info:
        parse(expr)
    assert needle in str(info.value)
    assert len(str(info.value)) < 400  # the 4,400-digit number is not echoed back


def test_spaces_and_tabs_separate_fields_and_ascii_names_any_case() -> None:
    assert parse("\t0\t \t9  * *\tmOn ") == parse("0 9 * * MON")
    assert parse("0 0 1 sep *").months == {9}
    assert parse("@Daily") == parse("0 0 * * *")
    assert parse("*/60 * * * *").minutes == {0}  # the span itself is still allowed
    assert parse("0 0 * * 1/2").weekdays == {1, 3, 5, 0}  # `1/2` reads as `1-7/2`
    assert parse("0 0 007 * *").days == {7}


def test_error_message_shape() -> None:
    with pytest.raises(CronError) as info:
        parse("0 25 * * *")
    assert str(info.value) == "cron field 'hour' in '0 25 * * *': 25 is out of range 0-23"


def test_union_makes_feb_30_valid() -> None:
    # Both day fields restricted: Mondays in February fire even though Feb 30 never exists.
    assert next_fire("0 0 30 2 MON", utc(2024, 3, 1)) == utc(2025, 2, 3)


# -- next_fire tables --

NEXT_FIRE_CASES = [
    ("*/15 * * * *", utc(2024, 1, 1, 10, 7), utc(2024, 1, 1, 10, 15)),
    ("*/15 * * * *", utc(2024, 1, 1, 10, 15), utc(2024, 1, 1, 10, 30)),  # strictly after
    ("*/15 * * * *", utc(2024, 1, 1, 10, 14, 59, 999999), utc(2024, 1, 1, 10, 15)),
    ("*/15 * * * *", utc(2024, 1, 1, 10, 15, 0, 1), utc(2024, 1, 1, 10, 30)),
    ("*/15 * * * *", utc(2024, 12, 31, 23, 50), utc(2025, 1, 1, 0, 0)),
    ("0 2 * * *", utc(2024, 1, 31, 3, 0), utc(2024, 2, 1, 2, 0)),
    ("0 2 * * *", utc(2024, 12, 31, 2, 0), utc(2025, 1, 1, 2, 0)),
    ("0 2 * * *", utc(2024, 2, 28, 23, 0), utc(2024, 2, 29, 2, 0)),
    ("0 2 * * *", utc(2023, 2, 28, 23, 0), utc(2023, 3, 1, 2, 0)),
    ("10-50/20 * * * *", utc(2024, 1, 1, 10, 0), utc(2024, 1, 1, 10, 10)),
    ("10-50/20 * * * *", utc(2024, 1, 1, 10, 50), utc(2024, 1, 1, 11, 10)),
    ("5/15 * * * *", utc(2024, 1, 1, 10, 51), utc(2024, 1, 1, 11, 5)),
    ("1-3,*/20 * * * *", utc(2024, 1, 1, 10, 3), utc(2024, 1, 1, 10, 20)),
    ("0 9 1,15 * *", utc(2024, 1, 2), utc(2024, 1, 15, 9, 0)),
    ("0 12 * JAN,JUL *", utc(2024, 2, 1), utc(2024, 7, 1, 12, 0)),
    ("59 23 31 12 *", utc(2024, 12, 31, 23, 59), utc(2025, 12, 31, 23, 59)),
    ("0 0 1 1 *", utc(2024, 1, 1), utc(2025, 1, 1)),
    ("0 9 * * MON-FRI", utc(2024, 3, 8, 9, 0), utc(2024, 3, 11, 9, 0)),  # Fri -> Mon
    ("0 9 * * MON-FRI", utc(2024, 3, 11, 8, 0), utc(2024, 3, 11, 9, 0)),
    ("*/15 9-17 * * MON-FRI", utc(2024, 3, 8, 17, 45), utc(2024, 3, 11, 9, 0)),
    ("0 0 * * 7", utc(2024, 3, 8), utc(2024, 3, 10)),
    ("0 0 * * FRI-SUN", utc(2024, 3, 11), utc(2024, 3, 15)),
    ("0 0 * * FRI-SUN", utc(2024, 3, 16), utc(2024, 3, 17)),
    ("@weekly", utc(2024, 3, 13, 12, 0), utc(2024, 3, 17)),
    ("@hourly", utc(2024, 3, 13, 12, 0), utc(2024, 3, 13, 13, 0)),
    # Vixie union: the 13th OR a Friday.
    ("0 0 13 * FRI", utc(2024, 9, 1), utc(2024, 9, 6)),  # Friday 6th
    ("0 0 13 * FRI", utc(2024, 10, 11), utc(2024, 10, 13)),  # Sunday 13th
    ("0 0 13 * FRI", utc(2024, 10, 13), utc(2024, 10, 18)),  # next Friday
    # Vixie: '*/10' counts as unrestricted, so the day fields intersect.
    ("0 0 */10 * MON", utc(2024, 1, 1), utc(2024, 3, 11)),
    ("0 0 29 2 *", utc(2025, 3, 1), utc(2028, 2, 29)),
    ("0 0 29 2 *", utc(2096, 3, 1), utc(2104, 2, 29)),  # 2100 is not a leap year
    ("0 0 29 2 */7", utc(2024, 3, 1), utc(2032, 2, 29)),  # Feb 29 that is a Sunday
    ("0 0 31 * *", utc(2024, 4, 1), utc(2024, 5, 31)),
    ("0 0 31 * *", utc(2024, 5, 31), utc(2024, 7, 31)),
    ("0 0 31 * *", utc(2024, 7, 31), utc(2024, 8, 31)),
]


@pytest.mark.parametrize(("expr", "after", "expected"), NEXT_FIRE_CASES)
def test_next_fire_table(expr: str, after: datetime, expected: datetime) -> None:
    got = next_fire(expr, after)
    assert got == expected
    assert got.tzinfo is UTC
    assert next_fire(parse(expr), after) == expected


def test_result_is_in_requested_zone() -> None:
    # 04:00 UTC is 09:30 in Kolkata, so today's 09:00 has passed.
    got = next_fire("0 9 * * *", utc(2024, 1, 1, 4, 0), tz="Asia/Kolkata")
    assert got.tzinfo == ZoneInfo("Asia/Kolkata")
    assert (got.hour, got.minute, got.day) == (9, 0, 2)
    assert got == utc(2024, 1, 2, 3, 30)


def test_fixed_offset_zone_from_after() -> None:
    plus530 = timezone(timedelta(hours=5, minutes=30))
    got = next_fire("0 9 * * *", datetime(2024, 1, 1, 8, 59, tzinfo=plus530))
    assert got == datetime(2024, 1, 1, 9, 0, tzinfo=plus530)


def test_naive_after_and_bad_zone() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        next_fire("* * * * *", datetime(2024, 1, 1))
    with pytest.raises(ConfigError, match="Mars/Olympus"):
        next_fire("* * * * *", utc(2024, 1, 1), tz="Mars/Olympus")
    with pytest.raises(TypeError):
        parse(5)  # type: ignore[arg-type]


# -- DST: Debian cron(8) --
# Fixed-time jobs (minute and hour both not beginning with `*`) get the gap/repeat policy;
# wildcard jobs (minute or hour beginning with `*`) run in real time.

DST_FIXED_CASES = [
    # Berlin 2024-03-31: 02:00 CET jumps to 03:00 CEST. The skipped 02:30 fires at 03:00 CEST.
    ("30 2 * * *", datetime(2024, 3, 30, 3, 0, tzinfo=BERLIN), BERLIN, utc(2024, 3, 31, 1, 0)),
    ("30 2 * * *", utc(2024, 3, 31, 1, 0), BERLIN, utc(2024, 4, 1, 0, 30)),  # strictly after
    # Four skipped times coalesce into one fire at the end of the gap.
    ("0,15,30,45 2 * * *", utc(2024, 3, 30, 12, 0), BERLIN, utc(2024, 3, 31, 1, 0)),
    ("0-59/15 2 * * *", utc(2024, 3, 31, 1, 0), BERLIN, utc(2024, 4, 1, 0, 0)),
    ("0 3 * * *", utc(2024, 3, 30, 12, 0), BERLIN, utc(2024, 3, 31, 1, 0)),
    ("0 1-3 * * *", utc(2024, 3, 31, 0, 0), BERLIN, utc(2024, 3, 31, 1, 0)),  # 02:00 -> 03:00
    ("0 1-3 * * *", utc(2024, 3, 31, 1, 0), BERLIN, utc(2024, 3, 31, 23, 0)),  # 03:00 coalesced
    # New York 2024-03-10: 02:00 EST jumps to 03:00 EDT.
    ("30 2 * * *", datetime(2024, 3, 9, 12, 0, tzinfo=NEW_YORK), NEW_YORK, utc(2024, 3, 10, 7, 0)),
    # New York 2024-11-03: 01:00-02:00 happens twice; 01:30 fires once, in EDT (fold=0).
    (
        "30 1 * * *",
        datetime(2024, 11, 2, 12, 0, tzinfo=NEW_YORK),
        NEW_YORK,
        utc(2024, 11, 3, 5, 30),
    ),
    ("30 1 * * *", utc(2024, 11, 3, 5, 30), NEW_YORK, utc(2024, 11, 4, 6, 30)),
    ("30 1 * * *", utc(2024, 11, 3, 6, 0), NEW_YORK, utc(2024, 11, 4, 6, 30)),  # after is in fold=1
    ("0,30 1 * * *", datetime(2024, 11, 3, 1, 15, fold=1, tzinfo=NEW_YORK), NEW_YORK,
     utc(2024, 11, 4, 6, 0)),  # both repeated times already fired at fold=0
    # Berlin 2024-10-27: 03:00 CEST falls back to 02:00 CET.
    ("30 2 * * *", utc(2024, 10, 26, 12, 0), BERLIN, utc(2024, 10, 27, 0, 30)),
    ("30 2 * * *", utc(2024, 10, 27, 0, 30), BERLIN, utc(2024, 10, 28, 1, 30)),
]


@pytest.mark.parametrize(("expr", "after", "tz", "expected"), DST_FIXED_CASES)
def test_dst_fixed_time_policy(expr: str, after: datetime, tz: ZoneInfo,
                               expected: datetime) -> None:
    assert not parse(expr).wildcard_time
    got = next_fire(expr, after, tz=tz)
    # Compare in UTC: PEP 495 makes a repeated local time unequal to every other zone's datetime.
    assert got.astimezone(UTC) == expected
    assert got.tzinfo is tz
    assert got.fold == 0


def _fires(expr: str, start: datetime, count: int, tz: ZoneInfo) -> list[datetime]:
    out, at = [], start
    for _ in range(count):
        at = next_fire(expr, at, tz=tz)
        out.append(at)
    return out


def _local(fires: list[datetime]) -> list[str]:
    return [f"{t:%H:%M %Z}" for t in fires]


def test_issue_example_hourly_at_berlin_fall_back_runs_every_real_hour() -> None:
    got = _fires("0 * * * *", datetime(2024, 10, 27, 1, 30, tzinfo=BERLIN), 3, BERLIN)
    assert _local(got) == ["02:00 CEST", "02:00 CET", "03:00 CET"]
    assert [t.fold for t in got] == [0, 1, 0]
    assert [t.astimezone(UTC) for t in got] == [utc(2024, 10, 27, h) for h in (0, 1, 2)]


def test_issue_example_every_30_minutes_at_new_york_fall_back_has_no_hole() -> None:
    got = _fires("*/30 * * * *", datetime(2024, 11, 3, 0, 45, tzinfo=NEW_YORK), 5, NEW_YORK)
    assert _local(got) == ["01:00 EDT", "01:30 EDT", "01:00 EST", "01:30 EST", "02:00 EST"]
    utcs = [t.astimezone(UTC) for t in got]
    assert {b - a for a, b in zip(utcs, utcs[1:], strict=False)} == {timedelta(minutes=30)}


def test_issue_example_half_past_at_berlin_spring_forward_has_no_extra_fire() -> None:
    got = _fires("30 * * * *", datetime(2024, 3, 31, 1, 0, tzinfo=BERLIN), 2, BERLIN)
    assert _local(got) == ["01:30 CET", "03:30 CEST"]


@pytest.mark.parametrize(("expr", "wild"), [
    ("0 * * * *", True), ("*/15 2 * * *", True), ("30 */2 * * *", True), ("@hourly", True),
    ("* 3 * * *", True), ("30 2 * * *", False), ("0-59/15 2 * * *", False),
    ("0 9-17 * * *", False), ("@daily", False), ("5/15 1 * * *", False),
])
def test_wildcard_means_minute_or_hour_text_begins_with_star(expr: str, wild: bool) -> None:
    assert parse(expr).wildcard_time is wild


def test_wildcard_jobs_skip_times_a_gap_removed() -> None:
    # `*/15 2 * * *` is a wildcard job: no 02:xx exists in Berlin on 2024-03-31, so no fire.
    got = next_fire("*/15 2 * * *", utc(2024, 3, 30, 12, 0), tz=BERLIN)
    assert got.astimezone(UTC) == utc(2024, 4, 1, 0, 0)


def test_wildcard_jobs_fire_in_both_occurrences_of_a_repeated_hour() -> None:
    got = _fires("*/20 1 * * *", datetime(2024, 11, 3, 0, 0, tzinfo=NEW_YORK), 7, NEW_YORK)
    assert _local(got) == ["01:00 EDT", "01:20 EDT", "01:40 EDT",
                           "01:00 EST", "01:20 EST", "01:40 EST", "01:00 EST"]
    assert got[-1].day == 4
    # Starting inside the second occurrence continues there.
    got = next_fire("*/20 1 * * *", datetime(2024, 11, 3, 1, 5, fold=1, tzinfo=NEW_YORK))
    assert got.astimezone(UTC) == utc(2024, 11, 3, 6, 20)
    # Starting late in the first occurrence goes back to the start of the second one.
    got = next_fire("*/20 1 * * *", datetime(2024, 11, 3, 1, 50, tzinfo=NEW_YORK))
    assert got.astimezone(UTC) == utc(2024, 11, 3, 6, 0) and got.fold == 1


def test_every_30_minutes_across_spring_forward() -> None:
    got = [t.astimezone(UTC) for t in
           _fires("*/30 * * * *", utc(2024, 3, 30, 23, 50), 5, BERLIN)]
    # 01:00 CET, 01:30 CET, [02:00-03:00 does not exist], 03:00 CEST, 03:30 CEST, 04:00 CEST
    assert got == [utc(2024, 3, 31, 0, m) for m in (0, 30)] + [
        utc(2024, 3, 31, 1, 0),
        utc(2024, 3, 31, 1, 30),
        utc(2024, 3, 31, 2, 0),
    ]
    assert {b - a for a, b in zip(got, got[1:], strict=False)} == {timedelta(minutes=30)}


# -- describe --


@pytest.mark.parametrize(
    ("expr", "text"),
    [
        ("0 9 * * MON-FRI", "at 09:00, on MON-FRI"),
        ("0 0 13 * FRI", "at 00:00, on day 13 of the month or on FRI"),
        ("*/20 * * * *", "at minute 0,20,40, every day"),
        (
            "* 8-10 1,2,3,9 JAN,FEB *",
            "every minute of hour 8-10, on day 1-3,9 of the month, in JAN,FEB",
        ),
    ],
)
def test_describe(expr: str, text: str) -> None:
    assert describe(expr) == text


# -- seeded property checks against brute force --

FIELD_RANGES = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 6)]
STAR_CHANCE = [0.2, 0.4, 0.6, 0.7, 0.6]
NAMES = {3: ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"],
         4: ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]}  # fmt: skip


def _gen_item(rng: random.Random, index: int) -> tuple[str, set[int]]:
    lo, hi = FIELD_RANGES[index]
    a = rng.randint(lo, hi)
    b = rng.randint(a, hi)
    n = rng.randint(1, (hi - lo) // 2 + 1)
    names = NAMES.get(index) if rng.random() < 0.3 else None

    def show(v: int) -> str:
        return names[v - lo] if names else str(v)

    kind = rng.choice(["one", "range", "range_step", "open_step", "star_step"])
    if kind == "one":
        if index == 4 and a == 0 and rng.random() < 0.5:
            return "7", {0}
        return show(a), {a}
    if kind == "range":
        return f"{show(a)}-{show(b)}", set(range(a, b + 1))
    if kind == "range_step":
        return f"{a}-{b}/{n}", set(range(a, b + 1, n))
    if kind == "open_step":  # open to the largest value as written: 7 in day of week
        return f"{a}/{n}", {v % 7 if index == 4 else v for v in range(a, hi + 1 + (index == 4), n)}
    return f"*/{n}", set(range(lo, hi + 1, n))


def _gen_expr(rng: random.Random) -> tuple[str, list[set[int]]]:
    texts, sets = [], []
    for index, (lo, hi) in enumerate(FIELD_RANGES):
        if rng.random() < STAR_CHANCE[index]:
            texts.append("*")
            sets.append(set(range(lo, hi + 1)))
            continue
        items = [_gen_item(rng, index) for _ in range(rng.choice([1, 1, 2, 3]))]
        texts.append(",".join(t for t, _ in items))
        sets.append(set().union(*(s for _, s in items)))
    return " ".join(texts), sets


def _ref_day(text: str, sets: list[set[int]], day: date) -> bool:
    """Reference day rule written from the Vixie description, independent of the module."""
    fields = text.split()
    in_dom, in_dow = day.day in sets[2], day.isoweekday() % 7 in sets[4]
    both_restricted = not fields[2].startswith("*") and not fields[4].startswith("*")
    day_ok = (in_dom or in_dow) if both_restricted else (in_dom and in_dow)
    return day.month in sets[3] and day_ok


def _ref_match(text: str, sets: list[set[int]], t: datetime) -> bool:
    return t.minute in sets[0] and t.hour in sets[1] and _ref_day(text, sets, t.date())


def _assert_no_earlier_match(text: str, sets: list[set[int]], after: datetime, got: datetime):
    if got - after <= timedelta(days=3):  # frequent: plain minute-by-minute scan
        t = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
        while t < got:
            assert not _ref_match(text, sets, t), (text, after, got, t)
            t += timedelta(minutes=1)
        return
    day = after.date()  # rare: scan every day, and every allowed time on matching days
    while day <= got.date():
        if _ref_day(text, sets, day):
            for h in sets[1]:
                for m in sets[0]:
                    t = datetime(day.year, day.month, day.day, h, m, tzinfo=UTC)
                    assert not after < t < got, (text, after, got, t)
        day += timedelta(days=1)


def _never_fires(sets: list[set[int]]) -> bool:
    longest = [0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
    return min(sets[2]) > max(longest[m] for m in sets[3])


def test_random_expressions_against_brute_force() -> None:
    rng = random.Random(20240229)
    checked = 0
    while checked < 200:
        text, sets = _gen_expr(rng)
        try:
            spec = parse(text)
        except CronError as exc:  # only "that day never occurs in those months" may be refused
            fields = text.split()
            union = not fields[2].startswith("*") and not fields[4].startswith("*")
            assert not union and _never_fires(sets) and "'day of month'" in str(exc), (text, exc)
            continue
        got_sets = [spec.minutes, spec.hours, spec.days, spec.months, spec.weekdays]
        assert got_sets == sets, text
        start = utc(2020, 1, 1) + timedelta(minutes=rng.randrange(10 * 365 * 1440))
        after = start + timedelta(seconds=rng.choice([0, 0, rng.randrange(60)]))
        got = next_fire(spec, after)
        assert got > after and got.second == 0 and got.microsecond == 0
        assert _ref_match(text, sets, got) and spec.matches(got), (text, after, got)
        _assert_no_earlier_match(text, sets, after, got)
        checked += 1


def _ref_dst_fire(text: str, sets: list[set[int]], after: datetime, zone: ZoneInfo) -> datetime:
    """Debian's DST rules restated on real time: walk UTC minutes. A wildcard job (minute or
    hour text begins with `*`) fires on every matching local minute. A fixed-time job fires on
    a first-occurrence match, or at the end of a gap when any skipped wall minute matches."""
    wildcard = any(f.startswith("*") for f in text.split()[:2])
    t = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    prev_wall = (t - timedelta(minutes=1)).astimezone(zone).replace(tzinfo=None)
    for _ in range(5 * 1440):
        local = t.astimezone(zone)
        wall = local.replace(tzinfo=None)
        if (wildcard or local.fold == 0) and _ref_match(text, sets, wall):
            return t
        if wildcard:
            t += timedelta(minutes=1)
            continue
        skipped = prev_wall + timedelta(minutes=1)
        while skipped < wall:
            if _ref_match(text, sets, skipped):
                return t
            skipped += timedelta(minutes=1)
        prev_wall, t = wall, t + timedelta(minutes=1)
    raise AssertionError(f"reference found no fire for {text!r} after {after}")


@pytest.mark.parametrize(
    ("zone", "transition"),
    [
        (BERLIN, utc(2024, 3, 31, 1, 0)),
        (BERLIN, utc(2024, 10, 27, 1, 0)),
        (NEW_YORK, utc(2024, 3, 10, 7, 0)),
        (NEW_YORK, utc(2024, 11, 3, 6, 0)),
        (LORD_HOWE, utc(2024, 4, 6, 15, 0)),  # a 30-minute fall-back: 02:00 -> 01:30
        (LORD_HOWE, utc(2024, 10, 5, 15, 30)),  # a 30-minute gap: 02:00 -> 02:30
    ],
)
def test_random_expressions_across_dst(zone: ZoneInfo, transition: datetime) -> None:
    rng = random.Random(transition.toordinal())
    for _ in range(60):
        text, sets = _gen_expr(rng)
        fields = text.split()
        text = " ".join(fields[:2] + ["*", "*", "*"])
        sets = sets[:2] + [set(range(1, 32)), set(range(1, 13)), set(range(7))]
        after = transition + timedelta(minutes=rng.randrange(-36 * 60, 12 * 60))
        after += timedelta(seconds=rng.choice([0, 30]))
        got = next_fire(text, after, tz=zone)
        assert got.tzinfo is zone
        assert got.astimezone(UTC) == _ref_dst_fire(text, sets, after, zone), (text, after)
