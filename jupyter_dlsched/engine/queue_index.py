"""The waiting jobs a decider keeps between decisions.

``QueueIndex`` is the agent's: each decision reads again only the rows of jobs with
an event since the last one, keeps each job's ``QueuedJob`` and, for a policy that
orders its queue in lanes, keeps the lanes sorted so a decision can offer it only the
head of the queue. The rows become the policy's inputs in ``rows.py``.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from itertools import compress, count
from operator import attrgetter, ne, not_
from typing import Any

from ..forecast import start_times
from ..policy import Decisions, Policy, PresortedQueue, QueuedJob, RunningJob
from ..policy.base import passes_through
from ..policy.lane_line import LaneLine
from ..store import WAITING, Store
from ..vocab.resources import Capacity, Request
from .lanes import Lanes
from .line_ranks import rerank
from .rows import queued_job, settle_dependencies

_job_id = attrgetter("id")
_job_request = attrgetter("request")


class QueueIndex:
    """The waiting jobs of one backend, kept between decisions by the one process deciding.

    Every change a decision depends on writes an ``events`` row (a submit, a
    state change, a priority change, a staged input bound), so each decision
    reads again only the rows of jobs with an event since the previous one
    (and the few running jobs, whose stop flags change without one). The
    policy's ``QueuedJob`` of a row is built once, and each job's rank in line
    (``line_ranks``) and reason are compared with the ones last computed, not re-read.

    With ``HEAD_FROM`` or more jobs offered, and a policy that can order its
    queue by lanes (``lane_layout``, ``lane``, ``head``: priority, fair, and
    the ranked policies that neither preempt nor learn), the jobs are also
    kept sorted in those lanes, and a decision offers the policy only the
    first ``HEAD`` of them in its order, with the requests of all. A policy
    that stops because none of those requests fits any more has decided what
    it would have decided over the whole queue; one that runs out of jobs
    first is asked again with the whole queue. Places in line and reasons
    come from the whole-queue decisions, taken at most every ``PLACES_EVERY``
    seconds (or ten times as long as one takes) while heads are decided; one
    that settles on the head reads the rest of the line from the lanes
    (``line``, ``places_from``) instead of asking the policy about every job.
    """

    #: Offered jobs from which a decision looks at the head of the queue only.
    HEAD_FROM = 1000
    #: Jobs in that head.
    HEAD = 256
    #: Seconds between whole-queue decisions (places in line) while heads are decided.
    PLACES_EVERY = 1.0

    def __init__(
        self, unwritten: MutableMapping[str, tuple[float | None, str | None]] | None = None
    ) -> None:
        self.seq = -1
        self.waiting: dict[str, sqlite3.Row] = {}
        self._in_order = True
        self._queued: dict[str, QueuedJob] = {}
        #: each waiting job's rank in line and reason, as last computed (or read)
        self.ranks: dict[str, float | None] = {}
        self.reasons: dict[str, str | None] = {}
        #: ranks and reasons computed but kept back by the engine (``flush_positions``): a
        #: job read again is taken as the ledger has it, and what was kept for it dropped
        self._unwritten = unwritten if unwritten is not None else {}
        #: what the last placement from the lanes told apart (``places_from``): each request's
        #: words for the jobs the policy did not look at, and the jobs it did look at
        self._words: dict[Request, str] | None = None
        self._told: set[str] = set()
        #: offered since the last placement: their reasons are compared one by one
        self._unplaced: set[str] = set()
        #: waiting jobs offered to the policy (no dependency, or all of them succeeded)
        self.offered: dict[str, QueuedJob] = {}
        #: waiting jobs with a dependency not known to have succeeded
        self.pending: dict[str, sqlite3.Row] = {}
        self.shapes: Counter[Request] = Counter()
        #: offered jobs stopped for an elastic resize, which restart wherever they wait
        self.resuming = 0
        self._shapes: frozenset[Request] | None = None  # of ``shapes``, until one comes or goes
        self._layout: Any = None
        #: the offered jobs in the policy's lanes, while it has a lane layout (``head``)
        self._lanes: Lanes | None = None
        self._places_at = 0.0  # time.monotonic() of the last whole-queue decision
        self._places_took = 0.0
        #: places in line may be out of date (something changed since they were written)
        self._stale = False
        #: each waiting job's start estimates as last written (``start_times``)
        self.estimates: start_times.Estimates = {}
        #: when (``time.time()``) the estimates go stale with no event (``start_times``)
        self.refresh_at = float("inf")

    def read(self, store: Store, db: sqlite3.Connection, backend: str) -> list[sqlite3.Row]:
        """The rows of the jobs holding a grant (running, or a success whose process still
        exits), after bringing the waiting ones up to date."""
        last = store.last_event_seq(db)
        if self.seq < 0:
            rows = store.queue.snapshot(db, backend)
            self._stale = True
            self._forget(list(self.waiting))
            self._add([r for r in rows if r["state"] in WAITING])
            running = [r for r in rows if r["state"] not in WAITING]
        else:
            if last != self.seq:
                self._stale = True
                changed = store.jobs_with_events_since(db, self.seq)
                self._forget(changed)
                fresh = [
                    r
                    for r in store.queue.snapshot_of(db, backend, changed)
                    if r["state"] != "running"
                ]
                self._add(sorted(fresh, key=lambda r: r["seq"]))
            running = store.queue.snapshot_running(db, backend)
        self.seq = last
        return running

    def _forget(self, ids: Iterable[str]) -> None:
        for job_id in ids:
            if self.waiting.pop(job_id, None) is None:
                continue
            self._queued.pop(job_id, None)
            self.ranks.pop(job_id, None)
            self.reasons.pop(job_id, None)
            self._unwritten.pop(job_id, None)
            self.estimates.pop(job_id, None)
            self.pending.pop(job_id, None)
            job = self.offered.pop(job_id, None)
            if job is not None:
                self._withdraw(job)

    def _add(self, rows: list[sqlite3.Row]) -> None:
        """Rows of waiting jobs, in submit order."""
        if rows and self.waiting:
            last = next(reversed(self.waiting.values()))
            self._in_order = self._in_order and rows[0]["seq"] > last["seq"]
        for row in rows:
            self.waiting[row["id"]] = row
            self.ranks[row["id"]] = row["position"]
            self.reasons[row["id"]] = row["waiting"]
            self._unwritten.pop(row["id"], None)
            if row["after"] == "[]" and row["begin"] is None:
                self._offer(self.queued(row))
            else:
                self.pending[row["id"]] = row

    def _offer(self, job: QueuedJob) -> None:
        self.offered[job.id] = job
        self._unplaced.add(job.id)
        if job.resume_on is not None:
            self.resuming += 1
        if not self.shapes[job.request]:
            self._shapes = None
        self.shapes[job.request] += 1
        if self._lanes is not None:
            self._lanes.add(job, self.ranks.get(job.id))

    def _withdraw(self, job: QueuedJob) -> None:
        if job.resume_on is not None:
            self.resuming -= 1
        self.shapes[job.request] -= 1
        if self.shapes[job.request] <= 0:
            del self.shapes[job.request]
            self._shapes = None
        if self._lanes is not None:
            self._lanes.remove(job.id)

    def in_submit_order(self) -> list[sqlite3.Row]:
        """The waiting jobs' rows in submit order (a requeued job keeps its number)."""
        if not self._in_order:
            self.waiting = dict(sorted(self.waiting.items(), key=lambda kv: kv[1]["seq"]))
            self._in_order = True
        return list(self.waiting.values())

    def resolve_dependencies(
        self, store: Store, db: sqlite3.Connection, now: float
    ) -> dict[str, str]:
        """Offer the jobs whose dependencies have all succeeded; fail those with a failed one;
        the reasons of the others, which still wait for theirs."""
        if not self.pending:
            return {}
        rows = list(self.pending.values())
        reasons = settle_dependencies(store, db, rows, now)
        blocked: dict[str, str] = {}
        for row in rows:
            why = reasons[row["id"]]
            if why is None:
                del self.pending[row["id"]]
                self._offer(self.queued(row))
            elif why:
                blocked[row["id"]] = why
        return blocked

    def head(self, policy: Policy, now: float) -> PresortedQueue | None:
        """The head of the queue to decide on (see the class), or ``None``: decide on all."""
        layout = getattr(policy, "lane_layout", None)
        if len(self.offered) < self.HEAD_FROM or not callable(layout):
            return None
        if policy.head({}, now, 0) is None:  # type: ignore[attr-defined]
            return None  # it preempts or learns: it looks at the whole queue, keep no lanes
        if self._lanes is None or layout() != self._layout:
            self._layout = layout()
            self._lanes = Lanes(policy, self.offered.values(), self.ranks)
        self._lanes.policy = policy
        queue = policy.head(self._lanes.jobs(), now, self.HEAD)  # type: ignore[attr-defined]
        if queue is not None:
            if self._shapes is None:
                self._shapes = frozenset(self.shapes)
            queue.shapes = self._shapes
        return queue

    def places_wanted(self, now: float) -> bool:
        """Whether this decision should also work out every waiting job's place in line:
        something changed since they were, or the estimates went stale, and they are due."""
        return (self._stale or now >= self.refresh_at) and (
            time.monotonic() >= self.places_due_monotonic()
        )

    def line(
        self,
        policy: Policy,
        decided: Decisions,
        head: Sequence[QueuedJob],
        running: list[RunningJob],
        capacity: Capacity,
        now: float,
    ) -> tuple[Sequence[QueuedJob], Callable[[QueuedJob], str]] | None:
        """The whole queue in the order a decision over it would give, and why a waiting
        job ``decided`` did not look at waits (``policy.line``), read from the lanes; or
        ``None`` where only a decision over the whole queue can say.

        ``decided`` is ``policy``'s settled decision on ``head``: it started what the
        whole queue would have started, so the policy's lanes say the rest, if no gate
        around the policy held a job back or changed what it decided
        (``passes_through``), and no job waits to resume an elastic run (it would start
        at once wherever it is in line)."""
        line = getattr(policy, "line", None)
        if not decided.settled or self.resuming or not callable(line) or self._lanes is None:
            return None
        if not passes_through(policy, decided, head, running):
            return None
        left = capacity
        for start in decided.starts:
            left = left.take(start.placement)
        made = line(self._lanes.jobs(), decided, head, running, left, now)
        return None if made is None else (made[0], made[1])

    def places_from(
        self,
        order: Sequence[QueuedJob],
        explain: Callable[[QueuedJob], str],
        decided: Decisions,
        blocked: Mapping[str, str],
    ) -> list[tuple[float | None, str | None, str]]:
        """Each waiting job's rank in line and reason after ``decided``, from the whole
        queue's ``order`` (``line``): ``(rank, reason, job id)`` of those that changed since
        last computed, which are kept as the ones computed now. A job keeps its rank while
        its order with the others holds (``line_ranks``): when the head starts, nothing
        behind it is written."""
        started = {s.job_id for s in decided.starts}
        said = {job_id: words for job_id, words in decided.waiting.items() if words}
        per_request = getattr(explain, "per_request", None)
        words: dict[Request, str] | None = None
        if per_request is not None:
            words = {r: per_request(r) for r in self.shapes}
        if words is not None and words == self._words:
            # every request has the words it had at the last placement: only the jobs the
            # policy looked at, then or now, and those new to the line may have new reasons
            same: dict[Request, str] = words
            told = self._told
            self._told = set(said)
            asked = {
                job_id: said.get(job_id) or same[self.offered[job_id].request]
                for job_id in {*said, *told, *self._unplaced}
                if job_id in self.offered and job_id not in started
            }
            if isinstance(order, LaneLine) and self._lanes is not None:
                moved = self._lanes.place(order, started, self.ranks)
                for rank, job_id in moved:
                    self.ranks[job_id] = rank
                changed = self._take_reasons(moved, asked)
                self._takeblocked(changed, blocked)
                return changed
            return self.take_places(self._ids_but(order, started), asked, blocked)
        # C-level maps over the line only: a deep queue's whole-queue decision has every
        # waiting job in it, and each job the policy did not look at shares its request's
        # words (``per_request``) with the others
        line: Sequence[QueuedJob] = order
        if started:
            line = [job for job in order if job.id not in started]
        ids = list(map(_job_id, line))
        if per_request is not None:  # words by request: asked once per request object
            requests = list(map(_job_request, line))
            kinds = dict(zip(map(id, requests), requests, strict=True))
            by_id = {key: per_request(request) for key, request in kinds.items()}
            whys = list(map(said.get, ids, map(by_id.__getitem__, map(id, requests))))
        else:
            whys = [said.get(job.id) or explain(job) for job in line]
        changed = self.take_places(ids, whys, blocked)
        self._words, self._told = words, set(said)
        return changed

    @staticmethod
    def _ids_but(order: Sequence[QueuedJob], started: set[str]) -> list[str]:
        ids = list(map(_job_id, order))
        if started:
            ids = list(compress(ids, map(not_, map(started.__contains__, ids))))
        return ids

    def take_places(
        self,
        ids: Sequence[str],
        whys: Sequence[str | None] | Mapping[str, str],
        blocked: Mapping[str, str],
    ) -> list[tuple[float | None, str | None, str]]:
        """Keep the line ``ids`` with their reasons (``whys``: one per job, or those of some
        of them, by id, the others' as they were) and the reasons of the jobs waiting for a
        dependency or a time (``blocked``); ``(rank, reason, job id)`` of the jobs whose
        rank or reason changed."""
        ranks, reasons = self.ranks, self.reasons
        moved = rerank(list(map(ranks.get, ids)))
        for i, rank in moved.items():
            ranks[ids[i]] = rank
        if self._lanes is not None and moved:  # the lanes' copies too
            if 8 * len(moved) > len(ids):
                self._lanes.rank_all(ranks)
            else:
                for i, rank in moved.items():
                    self._lanes.rank(ids[i], rank)
        if isinstance(whys, Mapping):
            changed = self._take_reasons([(moved[i], ids[i]) for i in sorted(moved)], whys)
        else:
            told = list(compress(count(), map(ne, whys, map(reasons.get, ids))))
            for i in told:
                reasons[ids[i]] = whys[i]
            self._words = None  # the next placement from the lanes compares every reason
            at = sorted({*moved, *told})  # in line order: written in that order
            changed = [(ranks[ids[i]], reasons[ids[i]], ids[i]) for i in at]
        self._takeblocked(changed, blocked)
        return changed

    def take_unlined(
        self,
        rows: Iterable[sqlite3.Row],
        lined: set[str],
        reasons: Mapping[str, str],
        changed: list[tuple[float | None, str | None, str]],
    ) -> None:
        """Add to ``changed`` the waiting jobs (``rows``) in neither the line (``lined``,
        with the jobs that started) nor waiting for a dependency or a time, which have no
        place in line now, only their reason (``reasons``)."""
        for row in rows:
            job_id = row["id"]
            if job_id in lined or job_id in self.pending:
                continue
            if (self.ranks.get(job_id), self.reasons.get(job_id)) != (None, reasons.get(job_id)):
                changed.append((None, reasons.get(job_id), job_id))
                self.ranks[job_id], self.reasons[job_id] = None, reasons.get(job_id)
                if self._lanes is not None:
                    self._lanes.rank(job_id, None)

    def _take_reasons(
        self, moved: list[tuple[float, str]], whys: Mapping[str, str]
    ) -> list[tuple[float | None, str | None, str]]:
        """Keep the reasons ``whys`` of some jobs: ``(rank, reason, job id)`` of the jobs
        given a new rank (``moved``: ``(rank, job id)`` in line order), then of those whose
        reason changed."""
        ranks, reasons = self.ranks, self.reasons
        said = [j for j, why in whys.items() if reasons.get(j) != why]
        for j in said:
            reasons[j] = whys[j]
        changed: list[tuple[float | None, str | None, str]] = [
            (rank, reasons[j], j) for rank, j in moved
        ]
        if said:
            seen = {j for _, j in moved}
            changed += [(ranks.get(j), reasons[j], j) for j in said if j not in seen]
        return changed

    def _takeblocked(
        self, changed: list[tuple[float | None, str | None, str]], blocked: Mapping[str, str]
    ) -> None:
        """Add to ``changed`` the jobs waiting for a dependency or a time whose reason changed
        (``blocked``); the jobs offered since the last placement are placed now."""
        ranks, reasons = self.ranks, self.reasons
        for job_id in self.pending:
            now_pending = (None, blocked.get(job_id))
            if (ranks.get(job_id), reasons.get(job_id)) != now_pending:
                changed.append((None, now_pending[1], job_id))
                ranks[job_id], reasons[job_id] = now_pending
        self._unplaced.clear()

    def stale(self) -> None:
        """A head was decided: places in line wait for the next whole-queue decision."""
        self._stale = True  # (every start moved the jobs behind it up)

    def placed(self, took: float) -> None:
        """A whole-queue decision wrote places in line; it took ``took`` seconds."""
        self._stale = False
        self._places_at = time.monotonic()
        self._places_took = took

    def places_due_monotonic(self) -> float:
        return self._places_at + max(self.PLACES_EVERY, 10 * self._places_took)

    def places_due(self) -> float:
        """When (``time.time()``) the next whole-queue decision is due."""
        return time.time() + max(0.0, self.places_due_monotonic() - time.monotonic())

    def queued(self, row: sqlite3.Row) -> QueuedJob:
        job = self._queued.get(row["id"])
        if job is None:
            job = self._queued[row["id"]] = queued_job(row)
        return job
