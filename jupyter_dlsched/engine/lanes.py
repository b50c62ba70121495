"""The waiting jobs of a policy that orders its queue in lanes, kept sorted in those lanes
with each job's rank in line beside it, so that a line the policy tells as stretches of its
lanes (``LaneLine``) is placed by copying arrays, not by visiting every waiting job.

``QueueIndex`` keeps one ``Lanes`` while its policy has a lane layout, and tells it every
job offered or withdrawn and every rank it sets; ``Lanes.place`` works out the ranks of a
whole line from the lanes (``line_ranks.rerank`` only where the order changed).
"""

from __future__ import annotations

import bisect
import math
from array import array
from collections.abc import Iterable, Mapping
from itertools import islice
from operator import attrgetter, lt
from typing import Any

from ..policy import QueuedJob
from ..policy.lane_line import LaneLine, Stretch
from .line_ranks import rerank

_job_id = attrgetter("id")


class Lane:
    """One lane of a policy's queue: jobs sorted by a key that does not change while they
    wait (lists kept side by side, so a job goes in and out by bisection), and each one's
    rank in line (``nan``: none yet) in an array."""

    __slots__ = ("jobs", "keys", "ranks")

    def __init__(
        self,
        keys: list[Any] | None = None,
        jobs: list[QueuedJob] | None = None,
        ranks: Iterable[float | None] = (),
    ) -> None:
        self.keys: list[Any] = keys or []
        self.jobs: list[QueuedJob] = jobs or []
        self.ranks = array("d", map(unset_nan, ranks))

    def add(self, key: Any, job: QueuedJob, rank: float | None) -> None:
        i = bisect.bisect_right(self.keys, key)
        self.keys.insert(i, key)
        self.jobs.insert(i, job)
        self.ranks.insert(i, unset_nan(rank))

    def at(self, key: Any, job_id: str) -> int:
        """Where the job ``job_id``, of lane key ``key``, is in the lane."""
        i = bisect.bisect_left(self.keys, key)
        while self.jobs[i].id != job_id:
            i += 1
        return i

    def remove(self, key: Any, job_id: str) -> None:
        i = self.at(key, job_id)
        del self.keys[i], self.jobs[i], self.ranks[i]


class Lanes:
    """The offered jobs in the lanes of ``policy`` (``policy.lane(job)``: the lane and the
    key within it), with their ranks as ``QueueIndex`` last set them."""

    def __init__(
        self, policy: Any, jobs: Iterable[QueuedJob], ranks: Mapping[str, float | None]
    ) -> None:
        #: the policy whose ``lane`` places a job (the index keeps it the latest one asked)
        self.policy = policy
        self._lanes: dict[Any, Lane] = {}
        self._of: dict[str, tuple[Any, Any]] = {}
        placed: dict[Any, list[tuple[Any, QueuedJob]]] = {}
        for job in jobs:
            lane, key = self._of[job.id] = policy.lane(job)
            placed.setdefault(lane, []).append((key, job))
        for lane, kept in placed.items():
            kept.sort(key=lambda kj: kj[0])
            in_lane = [j for _, j in kept]
            self._lanes[lane] = Lane(
                [k for k, _ in kept], in_lane, map(ranks.get, map(_job_id, in_lane))
            )

    def jobs(self) -> dict[Any, list[QueuedJob]]:
        """Each lane's jobs in order, as ``policy.head`` and ``policy.line`` read them."""
        return {lane: kept.jobs for lane, kept in self._lanes.items()}

    def add(self, job: QueuedJob, rank: float | None) -> None:
        lane, key = self._of[job.id] = self.policy.lane(job)
        kept = self._lanes.get(lane)
        if kept is None:
            kept = self._lanes[lane] = Lane()
        kept.add(key, job, rank)

    def remove(self, job_id: str) -> None:
        placed = self._of.pop(job_id, None)
        if placed is None:
            return
        lane, key = placed
        self._lanes[lane].remove(key, job_id)
        if not self._lanes[lane].jobs:
            del self._lanes[lane]

    def rank(self, job_id: str, rank: float | None) -> None:
        """The job ``job_id`` (if in a lane) has the rank ``rank`` now."""
        placed = self._of.get(job_id)
        if placed is not None:
            kept = self._lanes[placed[0]]
            kept.ranks[kept.at(placed[1], job_id)] = unset_nan(rank)

    def rank_all(self, ranks: Mapping[str, float | None]) -> None:
        """Every job has its rank in ``ranks`` now (many changed: read again at once)."""
        for kept in self._lanes.values():
            kept.ranks = array("d", map(unset_nan, map(ranks.get, map(_job_id, kept.jobs))))

    def place(
        self, order: LaneLine, started: set[str], ranks: Mapping[str, float | None]
    ) -> list[tuple[float, str]]:
        """The ranks of the line ``order`` once the jobs ``started`` left it: ``(rank, job
        id)`` of the jobs ranked again, in line order, which are kept as their ranks now
        (``ranks``: those of the jobs in loose pieces, which are in lanes too).

        The pieces' rank arrays are copied (no job is touched), the started jobs deleted by
        bisection, and the line checked for order in one pass; only a line out of order, or
        with a job not ranked yet (``nan`` compares false), goes through ``rerank``."""
        line = array("d")
        starts: list[int] = []  # where each piece begins in the line
        for piece in order.pieces:
            starts.append(len(line))
            if isinstance(piece, Stretch):
                line += self._lanes[piece.lane].ranks[piece.start : piece.stop]
            else:
                line.extend(map(unset_nan, map(ranks.get, map(_job_id, piece))))
        gone = sorted(self._in_line(order, starts, job_id) for job_id in started)
        for at in reversed(gone):
            del line[at]
        if all(map(lt, line, islice(line, 1, None))) and not (line and math.isnan(line[0])):
            return []  # in order and none unranked (nan compares false): the usual case
        placed: list[tuple[int, float, str]] = []
        for i, rank in rerank(list(map(_nan_unset, line))).items():
            at = i
            for g in gone:  # the place in the line before the started jobs left it
                if g > at:
                    break
                at += 1
            p = bisect.bisect_right(starts, at) - 1
            piece = order.pieces[p]
            if isinstance(piece, Stretch):
                kept = self._lanes[piece.lane]
                within = piece.start + at - starts[p]
                job_id = kept.jobs[within].id
            else:
                job_id = piece[at - starts[p]].id
                lane, key = self._of[job_id]
                kept = self._lanes[lane]
                within = kept.at(key, job_id)
            kept.ranks[within] = rank
            placed.append((i, rank, job_id))
        placed.sort()
        return [(rank, job_id) for _, rank, job_id in placed]

    def _in_line(self, order: LaneLine, starts: list[int], job_id: str) -> int:
        """Where the job ``job_id`` is in ``order`` (``starts``: where each piece begins)."""
        lane, key = self._of[job_id]
        within = self._lanes[lane].at(key, job_id)
        for piece, start in zip(order.pieces, starts, strict=True):
            if isinstance(piece, Stretch):
                if piece.lane == lane and piece.start <= within < piece.stop:
                    return start + within - piece.start
            else:
                at = next((i for i, job in enumerate(piece) if job.id == job_id), None)
                if at is not None:
                    return start + at
        raise ValueError(f"{job_id} is not in the line")


def unset_nan(rank: float | None) -> float:
    return math.nan if rank is None else rank


def _nan_unset(rank: float) -> float | None:
    return None if rank != rank else rank
