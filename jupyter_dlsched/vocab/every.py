"""A schedule's ticks: a duration (``3s``, ``1h``) or a cron expression (``0 2 * * 1-5``).

Cron has five fields — minute, hour, day of month, month, day of week (0 or 7 is
Sunday) — each ``*``, a number, a range ``a-b``, a step ``*/n`` or ``a-b/n``, or a list
of those; ``@hourly``, ``@daily``, ``@weekly``, ``@monthly`` and ``@yearly`` too. As in
cron, when both day fields are restricted a day matching either one is a tick. Times
are the machine's local time.

>>> every = parse_every("*/15 9-17 * * 1-5")
>>> from datetime import datetime
>>> datetime.fromtimestamp(every.next_after(datetime(2026, 12, 5, 12, 0).timestamp()))
datetime.datetime(2026, 12, 7, 9, 0)
>>> parse_every("3s").next_after(100.0)
103.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from .errors import SpecError
from .units import parse_duration

EVERY_HELP = (
    "a duration of at least 1 s ('3s', '30m', '1d') or a cron expression of five fields "
    "('0 2 * * *': every day at 02:00; '*/15 9-17 * * 1-5'; @hourly, @daily, @weekly)"
)
_SHORTHANDS = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
#: (lowest, highest) of minute, hour, day of month, month, day of week
_BOUNDS = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
#: a cron expression with no tick in this many years never has one (Feb 30)
_SEARCH_YEARS = 5
#: ticks of a cron expression walked to find its shortest gap (a year of a daily one)
_GAP_TICKS = 400


@dataclass(frozen=True)
class Every:
    """A parsed schedule: ``interval`` seconds, or the sets of a cron expression."""

    text: str
    interval: float | None = None
    minutes: frozenset[int] = frozenset()
    hours: frozenset[int] = frozenset()
    days: frozenset[int] = frozenset()
    months: frozenset[int] = frozenset()
    weekdays: frozenset[int] = frozenset()  # 0 = Sunday
    any_day: bool = True
    any_weekday: bool = True

    @property
    def is_cron(self) -> bool:
        return self.interval is None

    def next_after(self, t: float) -> float:
        """The first tick strictly after ``t`` (epoch seconds)."""
        if self.interval is not None:
            return t + self.interval
        moment = datetime.fromtimestamp(math.floor(t)).replace(second=0) + timedelta(minutes=1)
        limit = moment + timedelta(days=366 * _SEARCH_YEARS)
        while moment < limit:
            if moment.month not in self.months:
                year, month = (
                    (moment.year + 1, 1) if moment.month == 12 else (moment.year, moment.month + 1)
                )
                moment = datetime(year, month, 1)
            elif not self._day_matches(moment):
                moment = datetime(moment.year, moment.month, moment.day) + timedelta(days=1)
            elif moment.hour not in self.hours:
                moment = moment.replace(minute=0) + timedelta(hours=1)
            elif moment.minute not in self.minutes:
                moment += timedelta(minutes=1)
            else:
                return moment.timestamp()
        raise SpecError("every", self.text, "a cron expression that has a next time")

    def shortest_gap(self, longest_wanted: float) -> float:
        """The shortest time between two ticks, as far as it matters to ``longest_wanted``:
        an interval is itself; a cron expression ticks at most once a minute, and the ticks
        of its next few days are walked only when more than a minute is wanted.

        >>> parse_every("90s").shortest_gap(60), parse_every("*/5 * * * *").shortest_gap(600)
        (90.0, 300.0)
        """
        if self.interval is not None:
            return self.interval
        if longest_wanted <= 60.0:
            return 60.0
        t = self.next_after(datetime(2026, 1, 1).timestamp())  # from a tick, not between
        shortest = math.inf
        for _ in range(_GAP_TICKS):
            after = self.next_after(t)
            shortest = min(shortest, after - t)
            if shortest < longest_wanted:
                break
            t = after
        return shortest

    def _day_matches(self, moment: datetime) -> bool:
        day_ok = moment.day in self.days
        weekday_ok = (moment.isoweekday() % 7) in self.weekdays
        if self.any_day and self.any_weekday:
            return True
        if self.any_day:
            return weekday_ok
        if self.any_weekday:
            return day_ok
        return day_ok or weekday_ok


def parse_every(value: object) -> Every:
    """Read ``--every``; a bad one raises ``SpecError`` naming what is allowed."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = f"{value}s"
    if not isinstance(value, str) or not value.strip():
        raise SpecError("every", value, EVERY_HELP)
    text = " ".join(value.split())
    expression = _SHORTHANDS.get(text.lower(), text)
    fields = expression.split(" ")
    if len(fields) == 1:
        try:
            seconds = parse_duration(text, "every")
        except SpecError:
            raise SpecError("every", value, EVERY_HELP) from None
        if seconds < 1:
            raise SpecError("every", value, EVERY_HELP)
        return Every(text=text, interval=seconds)
    if len(fields) != 5:
        raise SpecError("every", value, EVERY_HELP)
    sets = [_field(f, lo, hi, value) for f, (lo, hi) in zip(fields, _BOUNDS, strict=True)]
    weekdays = frozenset(d % 7 for d in sets[4])
    every = Every(
        text=text,
        minutes=sets[0],
        hours=sets[1],
        days=sets[2],
        months=sets[3],
        weekdays=weekdays,
        any_day=fields[2] == "*",
        any_weekday=fields[4] == "*",
    )
    every.next_after(datetime(2000, 1, 1).timestamp())  # refuses one that never ticks (Feb 30)
    return every


def _field(text: str, lo: int, hi: int, whole: object) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        base, _, step_text = part.partition("/")
        try:
            step = int(step_text) if step_text else 1
            if base == "*":
                start, end = lo, hi
            elif "-" in base:
                a, b = base.split("-", 1)
                start, end = int(a), int(b)
            else:
                start = int(base)
                end = hi if step_text else start
        except ValueError:
            raise SpecError("every", whole, EVERY_HELP) from None
        if step < 1 or not lo <= start <= end <= hi:
            raise SpecError("every", whole, EVERY_HELP)
        values.update(range(start, end + 1, step))
    return frozenset(values)


def check_interval(every: str, minimum: float) -> None:
    """Refuse a schedule whose ticks come closer than ``minimum`` seconds, a pool's
    ``min_schedule_interval``: each tick makes a job, and a job a second from each of a
    user's schedules slows every decision of the pool.

    >>> check_interval("1s", 60)
    Traceback (most recent call last):
    ...
    jupyter_dlsched.vocab.errors.SpecError: --every 1s is below this pool's minimum interval of 1m (min_schedule_interval)
    """
    if minimum <= 0 or parse_every(every).shortest_gap(minimum) >= minimum:
        return
    words = interval_words(minimum)
    refused = SpecError("every", every, f"ticks at least {words} apart (min_schedule_interval)")
    shown = f"'{every}'" if " " in every else every
    refused.args = (
        f"--every {shown} is below this pool's minimum interval of {words} (min_schedule_interval)",
    )
    raise refused


def interval_words(seconds: float) -> str:
    """``"1m"``, ``"90s"``, ``"2h"``: a duration as it would be written after ``--every``.

    >>> interval_words(60), interval_words(90), interval_words(7200), interval_words(0.5)
    ('1m', '90s', '2h', '0.5s')
    """
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
