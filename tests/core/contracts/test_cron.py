"""core.contracts.cron: parsing (table), errors naming the field, next fire times with a controlled clock."""

from datetime import UTC, datetime

import pytest

from core.contracts.cron import CronError, next_fire, parse


def t(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    "expr, field, expected",
    [
        ("0 2 * * *", "minutes", {0}),
        ("0 2 * * *", "hours", {2}),
        ("*/15 * * * *", "minutes", {0, 15, 30, 45}),
        ("5-10/2 * * * *", "minutes", {5, 7, 9}),
        ("50/5 * * * *", "minutes", {50, 55}),
        ("1,2,30-31 * * * *", "minutes", {1, 2, 30, 31}),
        ("0 0 * * 7", "days_of_week", {0}),  # 7 is Sunday too
        ("0 0 * * mon-fri", "days_of_week", {1, 2, 3, 4, 5}),
        ("0 0 1 jan,JUL *", "months", {1, 7}),
        ("@daily", "hours", {0}),
        ("  0   2  *  *   * ", "hours", {2}),  # extra blanks are fine
    ],
)
def test_fields_parse(expr, field, expected):
    assert set(getattr(parse(expr), field)) == expected


@pytest.mark.parametrize(
    "expr, field",
    [
        ("0 2 * *", "schedule"),  # four fields
        ("0 2 * * * *", "schedule"),
        ("60 * * * *", "minute"),
        ("* 24 * * *", "hour"),
        ("* * 0 * *", "day_of_month"),
        ("* * * 13 *", "month"),
        ("* * * * 8", "day_of_week"),
        ("*/0 * * * *", "minute"),
        ("*/100000000000000000000 * * * *", "minute"),  # a step of 10^20 was accepted
        ("* */25 * * *", "hour"),
        ("*/² * * * *", "minute"),  # a digit to str.isdigit, not to int()
        ("² * * * *", "minute"),
        ("5-1 * * * *", "minute"),
        ("a * * * *", "minute"),
        ("1,,2 * * * *", "minute"),
        ("0 0 31 2 *", "schedule"),  # parses, never fires
    ],
)
def test_errors_name_the_field(expr, field):
    with pytest.raises(CronError) as exc:
        parse(expr)
    assert exc.value.field == field and str(exc.value).startswith(field)


@pytest.mark.parametrize(
    "expr, after, expected",
    [
        ("0 2 * * *", t(2026, 12, 2, 1, 59), t(2026, 12, 2, 2, 0)),
        ("0 2 * * *", t(2026, 12, 2, 2, 0), t(2026, 12, 3, 2, 0)),  # strictly after
        ("0 2 * * *", t(2026, 12, 2, 2, 0, 30), t(2026, 12, 3, 2, 0)),
        ("0 2 * * *", t(2026, 12, 31, 3, 0), t(2027, 1, 1, 2, 0)),  # year rollover
        ("*/15 * * * *", t(2026, 1, 1, 10, 7), t(2026, 1, 1, 10, 15)),
        ("30 23 * * 0", t(2026, 12, 2, 0, 0), t(2026, 12, 6, 23, 30)),  # Wed -> Sunday
        ("0 0 29 2 *", t(2026, 3, 1), t(2028, 2, 29, 0, 0)),  # leap day
        ("0 0 1 * 1", t(2026, 12, 2), t(2026, 12, 7, 0, 0)),  # dom OR dow when both restricted: Monday Dec 7
        # Vixie: a dom starting with '*' counts as unrestricted, so both must match: day 1/11/21/31 and Monday
        ("0 0 */10 * 1", t(2026, 12, 2), t(2026, 12, 21, 0, 0)),
    ],
)
def test_next_fire(expr, after, expected):
    assert next_fire(expr, after) == expected


def test_next_fire_needs_an_aware_time():
    with pytest.raises(ValueError, match="after"):
        parse("0 2 * * *").next_after(datetime(2026, 1, 1))
