"""``begin``: when a job may start at the earliest, as SLURM's ``--begin`` spells it.

Accepted: a duration from now (``90s``, ``2h``, or seconds), ``now+5m``, a time of day
(``14:30`` or ``14:30:15``: the next time the clock shows it), an ISO date-time
(``2026-12-02T02:00``, local time unless it names its zone), a ``datetime``, or epoch
seconds (a number above ten years). A time already past means "now".

>>> parse_begin("now+5s", now=1000.0)
1005.0
>>> parse_begin("90s", now=1000.0)
1090.0
"""

from __future__ import annotations

import math
import re
import time
from datetime import datetime, timedelta

from .errors import SpecError
from .units import parse_duration

BEGIN_HELP = (
    "a duration from now ('90s', '2h'), 'now+5m', a time of day ('14:30'), an ISO "
    "date-time ('2026-12-02T02:00'), a datetime or epoch seconds, within ten years of now"
)
#: a begin further than this from now (either way) is a mistake, not a plan
BEGIN_RANGE = 10 * 365 * 86400.0
_TIME_OF_DAY = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?$")


def parse_begin(value: object, now: float | None = None) -> float | None:
    """Epoch seconds before which the job does not start (None: no such time)."""
    if value is None:
        return None
    now = time.time() if now is None else now
    when: float | None = None
    try:
        if isinstance(value, datetime):
            when = value.timestamp()
        elif isinstance(value, bool):
            when = None
        elif isinstance(value, int | float):
            # small numbers are seconds from now (like "90s"), large ones a moment in time
            when = float(value) if value > BEGIN_RANGE else now + parse_duration(value, "begin")
        elif isinstance(value, str):
            when = _from_text(value.strip(), now)
    except (SpecError, ValueError, OverflowError, OSError):
        when = None
    if when is None or not math.isfinite(when) or abs(when - now) > BEGIN_RANGE:
        raise SpecError("begin", value, BEGIN_HELP)
    return when


def _from_text(text: str, now: float) -> float:
    lowered = text.lower()
    if lowered == "now":
        return now
    if lowered.startswith("now+"):
        return now + parse_duration(lowered[4:].strip(), "begin")
    clock = _TIME_OF_DAY.match(text)
    if clock:
        hour, minute, second = int(clock[1]), int(clock[2]), int(clock[3] or 0)
        today = datetime.fromtimestamp(now).replace(
            hour=hour, minute=minute, second=second, microsecond=0
        )
        moment = today if today.timestamp() > now else today + timedelta(days=1)
        return moment.timestamp()
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return now + parse_duration(text, "begin")


def begin_words(begin: float, now: float | None = None) -> str:
    """Why a job waits for its ``begin``: ``"not before 14:30:00 (--begin)"``; a begin on
    another day names the date too."""
    now = time.time() if now is None else now
    moment = datetime.fromtimestamp(begin)
    same_day = moment.date() == datetime.fromtimestamp(now).date()
    text = moment.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M:%S")
    return f"not before {text} (--begin)"
