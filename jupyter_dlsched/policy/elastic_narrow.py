"""Elastic jobs in a replay: decided at the size they asked for, started narrower only on
GPUs nobody waiting can use.

A trace records what each job asked for; an elastic job of it may run on fewer GPUs
or more (``QueuedJob.min_gpus`` up to ``max_gpus``). Offered to the wrapped policy at
its minimum, a wide job starts at once on one GPU and runs there for a long time,
taking the holes that the shorter jobs behind it would have filled: the blind
policies waited longer on average with elastic jobs than without. Offered at the size
it asked for, the policy decides exactly as for the rigid job, backfill included; then
``start_narrow`` starts a waiting elastic job at its minimum on GPUs the policy left
idle, but only at the head of the policy's line, where it takes nothing the policy
gave or kept for another job, and ``ElasticPolicy`` lets it grow into the rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from ..vocab.placement import place
from ..vocab.resources import Capacity, Placement
from .base import Decisions, QueuedJob, Start


def start_narrow(
    queued: Sequence[QueuedJob],
    decisions: Decisions,
    starts: list[Start],
    room: Capacity,
    budget: dict[str, float],
) -> tuple[dict[str, tuple[QueuedJob, Placement]], Capacity]:
    """The elastic jobs that start below the size they asked for on the GPUs free in
    ``room`` (what the wrapped policy's ``decisions`` left idle), and what is left of it.

    In the policy's order, from the first job it did not start: each elastic job whose
    request does not fit but whose minimum does starts at its minimum, within its
    owner's ``budget`` of GPUs (owners not in it have no limit); the first job that
    cannot (a rigid job, one waiting for a shrink, one held for another reason: its
    request fits, or its minimum does not) ends the walk. ``starts``: those of
    ``decisions`` that go ahead now; the others wait for elastic jobs to shrink. Returns
    each job started here (by id) with its placement; they leave ``decisions``' waiting
    reasons and order.

    >>> from jupyter_dlsched.vocab.resources import Request
    >>> wide = QueuedJob("w", 0, 0.0, Request(gpus=4, cpus=0), max_gpus=8, min_gpus=1)
    >>> cap = Capacity.empty(n_gpus=4, gpu_mem=1000, cpus=0, mem=0)
    >>> cap = cap.take(Placement(gpus=(0, 1), gpu_mem=(1000, 1000)))
    >>> narrow, left = start_narrow([wide], Decisions(order=["w"]), [], cap, {})
    >>> [p.gpus for _, p in narrow.values()], left.free_whole_gpus
    ([(2,)], 1)
    """
    by_id = {q.id: q for q in queued}
    order = [by_id[i] for i in decisions.order if i in by_id] or list(queued)
    going = {s.job_id for s in starts}
    shrinking = {s.job_id for s in decisions.starts} - going
    budget = dict(budget)
    narrow: dict[str, tuple[QueuedJob, Placement]] = {}
    for job in order:
        if job.id in going:
            continue
        free, low = room.free_whole_gpus, job.min_gpus
        if job.id in shrinking or low is None or not low <= free < job.request.whole_gpus:
            break
        if budget.get(job.owner, math.inf) < low:
            break
        placement = place(replace(job.request, gpus=float(low)), room)
        if placement is None:
            break
        room = room.take(placement)
        narrow[job.id] = (job, placement)
        if job.owner in budget:
            budget[job.owner] -= low
        decisions.waiting.pop(job.id, None)
    if narrow:
        decisions.order = [i for i in decisions.order if i not in narrow]
    return narrow, room
