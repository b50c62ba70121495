"""What a replay accepts, and how it reads what jobs declare.

Every mistake in ``simulate``'s arguments is a ``SimulationError`` that names the
argument, raised before the clock starts: a NaN overhead would stall the clock, a
job larger than the pool would wait forever. ``time_limits`` becomes each job's
declared ``time_limit``, and an elastic job's range is capped at the pool.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from .gpus import MAX_GPUS
from .results import SimulationError
from .trace import TraceJob


def check_replay(
    jobs: Sequence[TraceJob],
    gpus: int,
    nodes: int,
    restart_overhead: float,
    grace: float,
    time_limits: str | float | None,
) -> None:
    """Refuse a pool, an option or a job that the replay cannot run, naming it."""
    if gpus < 1 or nodes < 1 or gpus % nodes:
        raise SimulationError(
            f"gpus={gpus}, nodes={nodes}: need at least one GPU, split evenly over the nodes"
        )
    if gpus > MAX_GPUS:
        raise SimulationError(f"gpus={gpus}: the simulator models at most {MAX_GPUS} GPUs")
    for name, value in (("restart_overhead", restart_overhead), ("grace", grace)):
        if not _is_seconds(value):
            raise SimulationError(f"{name}={value!r} is invalid: expected seconds >= 0")
    if time_limits not in ("exact", "none", None) and not _is_factor(time_limits):
        raise SimulationError(
            f"time_limits={time_limits!r} is invalid: expected 'exact', None "
            "or a factor > 0 such as 2.0"
        )
    too_big = [j for j in jobs if j.gpus > gpus]
    if too_big:
        raise SimulationError(
            f"{len(too_big)} jobs ask for more than {gpus} GPUs (first: {too_big[0].id} "
            f"with {too_big[0].gpus}); filter them out (max_gpus) or add GPUs"
        )


def declared_limits(
    trace: Sequence[TraceJob], time_limits: str | float | None
) -> list[float | None]:
    """The ``time_limit`` each job of ``trace`` declares: none, its true duration
    (``"exact"``) or that times a factor."""
    if time_limits == "exact":
        return [j.duration for j in trace]
    if time_limits is None or time_limits == "none":
        return [None] * len(trace)
    factor = float(time_limits)
    return [j.duration * factor for j in trace]


def elastic_range(job: TraceJob, pool: int) -> tuple[int, int] | None:
    """An elastic job's GPU range, its maximum capped at the pool; ``None`` for a rigid job."""
    if job.elastic is None:
        return None
    low, high = job.elastic
    if not (1 <= low <= high) or low > pool:
        raise SimulationError(
            f"job {job.id!r}: elastic range {low}:{high} is invalid: expected "
            f"1 <= min <= max, min at most the pool's {pool} GPUs"
        )
    return low, min(high, pool)


def _is_seconds(value: object) -> bool:
    # nan compares false with everything, so it would stall the clock: finite only
    return isinstance(value, int | float) and math.isfinite(value) and value >= 0


def _is_factor(value: object) -> bool:
    try:
        factor = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return math.isfinite(factor) and factor > 0
