"""Random queues, pools and policies, and a ``QueueIndex`` holding such a queue, for the
tests of deciding on the head of a deep queue and reading places in line from its lanes."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from jupyter_dlsched.engine.queue_index import QueueIndex
from jupyter_dlsched.policy import Decisions, PresortedQueue, QueuedJob, RunningJob
from jupyter_dlsched.vocab.placement import place
from jupyter_dlsched.vocab.resources import Capacity, Request

GIB = 2**30

SHAPES = [
    Request(gpus=1, cpus=1),
    Request(gpus=2, cpus=1),
    Request(gpus=4, cpus=2),
    Request(gpus=0.5, cpus=1),
    Request(gpus=0.25, cpus=1, mem=4 * GIB),
    Request(gpus=0, cpus=2, mem=8 * GIB),
    Request(gpus=0, cpus=6, mem=40 * GIB),
]

POLICIES: list[tuple[str, dict[str, Any]]] = [
    ("priority", {}),
    ("priority", {"backfill": False}),
    ("priority", {"aging_interval": 0}),
    ("priority", {"reserve_after": 50.0}),
    ("fair", {}),
    ("fair", {"weights": {"ana": 3}}),
    ("fifo", {}),
    ("fifo-ff", {}),
    ("sjf", {}),
]


@st.composite
def queues(draw: Any) -> tuple[list[QueuedJob], list[RunningJob], Capacity, float]:
    n_gpus = draw(st.sampled_from([1, 2, 4, 8]))
    capacity = Capacity.empty(n_gpus=n_gpus, gpu_mem=16 * GIB, cpus=8, mem=64 * GIB)
    now = 10_000.0
    running: list[RunningJob] = []
    for i in range(draw(st.integers(0, 4))):
        request = draw(st.sampled_from(SHAPES))
        spot = place(request, capacity)
        if spot is None:
            continue
        capacity = capacity.take(spot)
        limit = draw(st.one_of(st.none(), st.sampled_from([60.0, 600.0, 6000.0])))
        running.append(
            RunningJob(
                f"r{i}",
                i,
                submitted=now - 5000,
                started=now - draw(st.sampled_from([10.0, 300.0])),
                request=request,
                placement=spot,
                owner=draw(st.sampled_from(["ana", "bo"])),
                time_limit=limit,
            )
        )
    jobs = []
    seq = 100
    submitted = now - 4000.0
    for i in range(draw(st.integers(1, 40))):
        seq += 1
        submitted += draw(st.sampled_from([0.0, 1.0, 250.0, 700.0]))
        jobs.append(
            QueuedJob(
                f"q{i}",
                seq,
                submitted=submitted,
                request=draw(st.sampled_from(SHAPES)),
                priority=draw(st.sampled_from([25, 50, 50, 75])),
                owner=draw(st.sampled_from(["ana", "bo", "cy"])),
                deadline=draw(st.one_of(st.none(), st.none(), st.sampled_from([9e4, 2e4]))),
                time_limit=draw(st.one_of(st.none(), st.sampled_from([30.0, 3000.0]))),
            )
        )
    return jobs, running, capacity, now


def head_of(policy: Any, jobs: list[QueuedJob], now: float, k: int) -> PresortedQueue:
    """What ``QueueIndex.head`` offers: the policy's lanes, their head, all the shapes."""
    lanes: dict[Any, list[tuple[Any, QueuedJob]]] = {}
    for job in jobs:
        lane, key = policy.lane(job)
        lanes.setdefault(lane, []).append((key, job))
    sorted_lanes = {
        lane: [job for _, job in sorted(kept, key=lambda kj: kj[0])] for lane, kept in lanes.items()
    }
    head = policy.head(sorted_lanes, now, k)
    assert head is not None
    head.shapes = frozenset(j.request for j in jobs)
    return head


def rows_of(jobs: list[QueuedJob]) -> list[dict[str, Any]]:
    """Waiting jobs' rows as the ledger gives them (no place in line yet), in submit order."""
    return [
        {
            "id": j.id,
            "seq": j.seq,
            "submitted": j.submitted,
            "gpus": j.request.gpus,
            "gpu_mem": j.request.gpu_mem,
            "cpus": j.request.cpus,
            "mem": j.request.mem,
            "priority": j.priority,
            "owner": j.owner,
            "deadline": j.deadline,
            "time_limit": j.time_limit,
            "preemptible": j.preemptible,
            "attained": j.attained,
            "preemptions": j.preemptions,
            "name": j.name,
            "max_gpus": j.max_gpus,
            "asked_gpus": None,
            "resize_to": None,
            "after": "[]",
            "begin": None,
            "position": None,
            "waiting": None,
        }
        for j in sorted(jobs, key=lambda j: j.seq)
    ]


def index_of(jobs: list[QueuedJob], k: int) -> QueueIndex:
    """A ``QueueIndex`` holding ``jobs`` as the agent's would (rows as the ledger gives them,
    no place in line yet), deciding on heads of ``k`` from any depth."""
    index = QueueIndex()
    index.HEAD_FROM, index.HEAD = 1, k
    index._add(rows_of(jobs))  # type: ignore[arg-type]
    return index


def numbered(index: QueueIndex, decided: Decisions) -> dict[str, tuple[int | None, str | None]]:
    """The places in line an index's ranks give after ``decided`` (what it started has
    left the line), numbered as the ledger's readers do."""
    started = {s.job_id for s in decided.starts}
    waiting = [job_id for job_id in index.ranks if job_id not in started]
    ranked = sorted(
        (index.ranks[job_id], index.waiting[job_id]["seq"], job_id)
        for job_id in waiting
        if index.ranks[job_id] is not None
    )
    line = {job_id: n for n, (_, _, job_id) in enumerate(ranked, 1)}
    return {job_id: (line.get(job_id), index.reasons.get(job_id)) for job_id in waiting}


def places(decisions: Decisions) -> dict[str, tuple[int | None, str | None]]:
    """Each waiting job's place in line and reason, as a decision over the whole queue says."""
    started = {s.job_id for s in decisions.starts}
    line = [job_id for job_id in decisions.order if job_id not in started]
    return {job_id: (n, decisions.waiting.get(job_id)) for n, job_id in enumerate(line, 1)}
