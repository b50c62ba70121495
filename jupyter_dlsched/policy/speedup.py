"""How much faster a job runs on more GPUs: the speedup models of elastic jobs.

The elastic layer (``jupyter_dlsched.policy.elastic``) weighs a resize by how
much it gains against its restart cost, and the simulator advances an elastic
job's work at the rate its size gives. Both read the same model, written as
text on the command line (``dlsched sim --speedup amdahl:0.05``):

* ``linear``: ``n`` GPUs run ``n`` times as fast as one;
* ``amdahl:F``: a serial fraction ``F`` (0 ≤ F < 1) does not speed up,
  ``1 / (F + (1 - F) / n)``;
* ``table:1=1,2=1.8,4=3.1``: measured speedups, linear in between, flat past
  the last entry (no gain is assumed that was not measured).

>>> parse_speedup("amdahl:0.1")(4)
3.0769230769230766
>>> parse_speedup("table:1=1,2=1.8,4=3")(3)
2.4
>>> parse_speedup("linear").ratio(2, 4)
2.0
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

from ..vocab.errors import DlschedError

MODELS = "linear, amdahl:FRACTION, or table:GPUS=SPEEDUP,..."


class SpeedupError(DlschedError, ValueError):
    """A speedup model's text cannot be read; the message says what is allowed."""


@dataclass(frozen=True)
class Speedup:
    """A speedup model: ``model(n)`` is the speed on ``n`` GPUs relative to one GPU."""

    name: str
    serial: float = 0.0  # Amdahl's serial fraction (0: linear)
    table: tuple[tuple[float, float], ...] = ()  # (GPUs, speedup), sorted by GPUs

    def __call__(self, gpus: float) -> float:
        n = max(1.0, float(gpus))
        if self.table:
            xs = [x for x, _ in self.table]
            i = bisect_right(xs, n)
            if i == 0:
                return self.table[0][1]
            if i == len(xs):
                return self.table[-1][1]
            (x0, y0), (x1, y1) = self.table[i - 1], self.table[i]
            return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
        return 1.0 / (self.serial + (1.0 - self.serial) / n)

    def ratio(self, old: float, new: float) -> float:
        """How many times as fast a job runs on ``new`` GPUs as on ``old``."""
        return self(new) / self(old)


LINEAR = Speedup("linear")


def parse_speedup(text: str | Speedup) -> Speedup:
    """The model that ``text`` names (see the module's docstring); a model passes through."""
    if isinstance(text, Speedup):
        return text
    words = text.strip()
    kind, _, arg = words.partition(":")
    kind = kind.strip().lower()
    if kind == "linear" and not arg:
        return LINEAR
    if kind == "amdahl":
        try:
            serial = float(arg)
        except ValueError:
            serial = math.nan
        if not (0.0 <= serial < 1.0):
            raise SpeedupError(
                f"speedup {text!r}: amdahl needs a serial fraction 0 <= F < 1, such as amdahl:0.05"
            )
        return Speedup(words, serial=serial)
    if kind == "table":
        points: dict[float, float] = {}
        for item in arg.split(","):
            n, eq, value = item.partition("=")
            try:
                x, y = float(n), float(value)
            except ValueError:
                x = y = math.nan
            if not eq or not (math.isfinite(x) and x >= 1 and math.isfinite(y) and y > 0):
                raise SpeedupError(
                    f"speedup {text!r}: {item.strip()!r} is not GPUS=SPEEDUP "
                    "(GPUs >= 1, speedup > 0), as in table:1=1,2=1.8,4=3.1"
                )
            points[x] = y
        return Speedup(words, table=tuple(sorted(points.items())))
    raise SpeedupError(f"speedup {text!r} is not a model; expected {MODELS}")
