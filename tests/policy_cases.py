"""Jobs and pools on plain data, as a policy sees them, for the tests of single decisions."""

from __future__ import annotations

from jupyter_dlsched.policy import QueuedJob, RunningJob
from jupyter_dlsched.vocab.placement import place
from jupyter_dlsched.vocab.resources import Capacity, Request

GIB = 2**30


def pool(gpus: int = 2) -> Capacity:
    return Capacity.empty(n_gpus=gpus, gpu_mem=16 * GIB, cpus=8, mem=64 * GIB)


def queued(job_id: str, seq: int, gpus: float = 1, **fields) -> QueuedJob:
    fields.setdefault("submitted", float(seq))
    return QueuedJob(job_id, seq, request=Request(gpus=gpus, cpus=1), **fields)


def running_on(capacity: Capacity, job_id: str, seq: int, gpus: float = 1, **fields):
    """A running job placed on ``capacity``; returns it with the capacity left."""
    request = Request(gpus=gpus, cpus=1)
    placement = place(request, capacity)
    assert placement is not None
    fields.setdefault("submitted", float(seq))
    fields.setdefault("started", float(seq))
    job = RunningJob(job_id, seq, request=request, placement=placement, **fields)
    return job, capacity.take(placement)


def started(decisions) -> list[str]:
    return [s.job_id for s in decisions.starts]


def preempted(decisions) -> list[str]:
    return [p.job_id for p in decisions.preempts]
