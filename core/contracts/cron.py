"""A small 5-field cron parser and next-fire calculator (stdlib only; all times UTC, minute resolution).

    minute hour day-of-month month day-of-week       e.g. '0 2 * * *' (02:00 every night)

Each field: '*', a number, a range 'a-b', a step '*/s', 'a-b/s' or 'a/s' (a to the field's max), or a
comma list of those. Months and weekdays also take names (jan..dec, sun..sat); weekday 7 is Sunday.
Aliases: @hourly, @daily, @midnight, @weekly, @monthly, @yearly, @annually.

Day rule (Vixie cron): when both day-of-month and day-of-week are restricted (neither starts with '*'),
a day matches when EITHER matches; otherwise both must.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day_of_month", 1, 31), ("month", 1, 12), ("day_of_week", 0, 7))
ALIASES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
NAMES = {
    "month": {
        m: i + 1
        for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))
    },
    "day_of_week": {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))},
}
FORMS = "'*', N, A-B, */S, A-B/S, A/S, or a comma list of those"
MAX_SEARCH_YEARS = 8  # Feb 29 recurs within 8 years; a schedule with no time in that span never fires


class CronError(ValueError):
    """A bad cron expression; `field` names the failing cron field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Cron:
    expression: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days_of_month: frozenset[int]
    months: frozenset[int]
    days_of_week: frozenset[int]  # 0 = Sunday (7 folded into 0)
    dom_restricted: bool
    dow_restricted: bool

    def _day_matches(self, d: datetime) -> bool:
        dom = d.day in self.days_of_month
        dow = (d.isoweekday() % 7) in self.days_of_week
        if self.dom_restricted and self.dow_restricted:
            return dom or dow
        return dom and dow

    def matches(self, t: datetime) -> bool:
        return t.minute in self.minutes and t.hour in self.hours and t.month in self.months and self._day_matches(t)

    def next_after(self, after: datetime) -> datetime:
        """The first matching minute strictly after `after` (aware; returned in UTC)."""
        if after.tzinfo is None:
            raise ValueError("after: must be timezone-aware (UTC)")
        t = after.astimezone(UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
        limit = t + timedelta(days=366 * MAX_SEARCH_YEARS)
        while t < limit:  # each step skips a whole month, day or hour that cannot match
            if t.month not in self.months:
                t = (t.replace(day=1, hour=0, minute=0) + timedelta(days=32)).replace(day=1)
            elif not self._day_matches(t):
                t = t.replace(hour=0, minute=0) + timedelta(days=1)
            elif t.hour not in self.hours:
                t = t.replace(minute=0) + timedelta(hours=1)
            elif t.minute not in self.minutes:
                t += timedelta(minutes=1)
            else:
                return t
        raise CronError("schedule", f"{self.expression!r} never fires (no matching time in {MAX_SEARCH_YEARS} years)")


def _number(text: str, field: str, lo: int, hi: int) -> int:
    value = NAMES.get(field, {}).get(text.lower())
    if value is None:
        if not (text.isascii() and text.isdigit()):
            raise CronError(field, f"{text!r} is not a number ({lo}-{hi}); forms: {FORMS}")
        value = int(text)
    if not lo <= value <= hi:
        raise CronError(field, f"{value} is outside {lo}-{hi}")
    return value


def _part(part: str, field: str, lo: int, hi: int) -> set[int]:
    base, _, step_text = part.partition("/")
    step = 1
    if step_text:
        # ASCII digits only ('²'.isdigit() is true but int() refuses it); a step beyond the field's span is a typo
        if not (step_text.isascii() and step_text.isdigit()) or not 1 <= int(step_text) <= hi - lo + 1:
            raise CronError(field, f"step {step_text[:40]!r} must be a number from 1 to {hi - lo + 1}")
        step = int(step_text)
    if base == "*":
        start, end = lo, hi
    elif "-" in base:
        a, _, b = base.partition("-")
        start, end = _number(a, field, lo, hi), _number(b, field, lo, hi)
        if start > end:
            raise CronError(field, f"range {base!r} runs backwards")
    else:
        start = _number(base, field, lo, hi)
        end = hi if step_text else start  # 'a/s': from a to the max
    return set(range(start, end + 1, step))


def _field(text: str, field: str, lo: int, hi: int) -> frozenset[int]:
    if not text:
        raise CronError(field, f"empty; forms: {FORMS}")
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(field, f"empty list item in {text!r}")
        values |= _part(part, field, lo, hi)
    return frozenset(values)


def parse(expression: str) -> Cron:
    """Parse a cron expression; CronError (a ValueError) names the failing field and its allowed range."""
    expr = " ".join(str(expression).split())
    expr = ALIASES.get(expr.lower(), expr)
    parts = expr.split(" ")
    if len(parts) != 5:
        raise CronError(
            "schedule",
            f"{expression!r} has {len(parts)} fields; a cron schedule has 5: "
            "minute hour day-of-month month day-of-week (e.g. '0 2 * * *')",
        )
    sets = [_field(p, name, lo, hi) for p, (name, lo, hi) in zip(parts, FIELDS)]
    dow = frozenset(d % 7 for d in sets[4])
    cron = Cron(
        expression=expr,
        minutes=sets[0],
        hours=sets[1],
        days_of_month=sets[2],
        months=sets[3],
        days_of_week=dow,
        dom_restricted=not parts[2].startswith("*"),
        dow_restricted=not parts[4].startswith("*"),
    )
    cron.next_after(datetime(2000, 1, 1, tzinfo=UTC))  # '0 0 31 2 *' parses but never fires: refuse it
    return cron


def next_fire(expression: str, after: datetime) -> datetime:
    return parse(expression).next_after(after)
