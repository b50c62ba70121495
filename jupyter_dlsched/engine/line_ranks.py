"""Places in line as ranks: what a decision writes so that only the jobs whose order changed
are written.

The ledger keeps each waiting job's *rank* (``jobs.position``), any numbers that increase
along the line; the place a user sees ("#3 in line") is numbered when read
(``store/job_reads.py``). So when the head of the line starts, the jobs behind it keep
their ranks and nothing is written; a job submitted last is ranked after the last one, one
moved ahead is ranked between its new neighbours.

>>> rerank([3.0, 4.0, None])  # the first two started, one job came in at the end
{2: 5.0}
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from itertools import compress, count, islice, repeat
from operator import ge, is_not, lt, not_
from typing import cast

#: the finest spacing kept between two ranks, relative to their size (floats keep 52 bits:
#: a gap halved this many times is widened instead, see ``_fill``)
_FINEST = 2.0**-36


def rerank(old: Sequence[float | None]) -> dict[int, float]:
    """The jobs of a line (``old``: their ranks in the line's order, ``None`` for one without)
    that need a new rank, as ``{index: rank}``, so that ranks strictly increase along the line.

    The ranks kept are the longest run of them already in order around the places where
    the order changed, so a job that moved is the one ranked again, not those it passed.
    A new line is ranked 1..n."""
    # C-level passes over the line only, unless something is out of order: a deep queue's
    # whole-queue decision calls this with every waiting job
    keep = list(map(is_not, old, repeat(None)))
    whole = all(keep)
    values = cast(Sequence[float], old if whole else list(compress(old, keep)))
    if all(map(lt, values, islice(values, 1, None))):
        if whole:
            return {}  # the usual case: the head left, or nothing moved
        return _fill(list(old), keep)
    at = range(len(old)) if whole else list(compress(count(), keep))
    ranks = list(old)
    for j in _out_of_order(values):
        keep[at[j]] = False
        ranks[at[j]] = None
    return _fill(ranks, keep)


def _out_of_order(values: Sequence[float]) -> list[int]:
    """Indices of the values to rank again: those outside a longest increasing subsequence
    of the stretch between the first and the last place where ``values`` do not increase
    (every value before and after that stretch is in order, and kept)."""
    breaks = list(compress(count(), map(ge, values, islice(values, 1, None))))
    first, last = breaks[0], breaks[-1] + 1
    low = values[first - 1] if first else None
    high = values[last + 1] if last + 1 < len(values) else None
    middle = [
        j
        for j in range(first, last + 1)
        if (low is None or values[j] > low) and (high is None or values[j] < high)
    ]
    chosen = {middle[k] for k in _longest_increasing([values[j] for j in middle])}
    return [j for j in range(first, last + 1) if j not in chosen]


def _longest_increasing(values: list[float]) -> list[int]:
    """Indices of a longest strictly increasing subsequence of ``values`` (patience sort)."""
    if not values:
        return []
    tails: list[float] = []
    tail_at: list[int] = []
    before = [-1] * len(values)
    for i, value in enumerate(values):
        k = bisect_left(tails, value)
        if k == len(tails):
            tails.append(value)
            tail_at.append(i)
        else:
            tails[k] = value
            tail_at[k] = i
        before[i] = tail_at[k - 1] if k else -1
    chosen = []
    i = tail_at[-1]
    while i >= 0:
        chosen.append(i)
        i = before[i]
    return chosen[::-1]


def _fill(ranks: list[float | None], keep: list[bool]) -> dict[int, float]:
    """Ranks for the jobs not kept, spread evenly between the kept ranks around each stretch
    of them (one past either end of the line); a gap too narrow for its stretch (many jobs
    put in at one spot) is widened by ranking its kept neighbours again too, doubling until
    it fits."""
    n = len(ranks)
    new: dict[int, float] = {}
    todo = list(compress(range(n), map(not_, keep)))
    t = 0
    while t < len(todo):
        start = end = todo[t]
        while t + 1 < len(todo) and todo[t + 1] == end + 1:
            t += 1
            end += 1
        t += 1
        while True:
            low = ranks[start - 1] if start else None
            high = ranks[end + 1] if end + 1 < n else None
            k = end - start + 1
            if high is None:  # the end of the line: one after another
                first = 1.0 if low is None else low + 1.0
                spread = [first + m for m in range(k)]
                break
            if low is None:  # the front of the line
                spread = [high - k + m for m in range(k)]
                break
            step = (high - low) / (k + 1)
            if step > _FINEST * max(1.0, abs(low), abs(high)):
                spread = [low + step * (m + 1) for m in range(k)]
                break
            start, end = max(0, start - k), min(n - 1, end + k)  # widen: twice as many
            while end + 1 < n and ranks[end + 1] is None:  # and the stretch it reached
                end += 1
        while t < len(todo) and todo[t] <= end:  # stretches the widening took in
            t += 1
        for m, rank in enumerate(spread):
            ranks[start + m] = rank
            new[start + m] = rank
    return new
