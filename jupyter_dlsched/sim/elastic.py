"""Turning a share of a trace's jobs elastic, for ``dlsched sim --elastic SHARE[:MAXFACTOR]``.

Traces record rigid jobs. To ask what elastic jobs would change, a share of
them is made elastic between 1 GPU and their request × ``max_factor``; their
recorded duration stays their run time at the size they asked for, and the
replay's speedup model (``--speedup``) says how fast they run on other sizes.
Which jobs: spread evenly through the trace in submit order (job ``i`` is
elastic when ``floor((i + 1) × share)`` passes a whole number), so the choice
is the same on every run and does not cluster in time.

>>> from jupyter_dlsched.sim.trace import TraceJob
>>> jobs = [TraceJob(str(i), float(i), 2, 60.0) for i in range(4)]
>>> [j.elastic for j in make_elastic(jobs, 0.5, 2)]
[None, (1, 4), None, (1, 4)]
>>> parse_elastic("0.5:4")
(0.5, 4.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from ..vocab.errors import DlschedError
from .trace import TraceJob

DEFAULT_MAX_FACTOR = 2.0


class ElasticOptionError(DlschedError, ValueError):
    """``--elastic`` has a value the simulator cannot use; the message says what is allowed."""


def parse_elastic(text: str) -> tuple[float, float]:
    """``"SHARE[:MAXFACTOR]"`` as ``(share, max_factor)``; factor 2 when left out."""
    share_text, _, factor_text = text.partition(":")
    try:
        share = float(share_text)
        factor = float(factor_text) if factor_text else DEFAULT_MAX_FACTOR
    except ValueError:
        share = factor = math.nan
    if not (0.0 <= share <= 1.0) or not (math.isfinite(factor) and factor >= 1.0):
        raise ElasticOptionError(
            f"--elastic {text!r} is invalid: expected SHARE[:MAXFACTOR], a share of jobs "
            "in [0, 1] and a factor >= 1, such as 0.5:4"
        )
    return share, factor


def make_elastic(jobs: Sequence[TraceJob], share: float, max_factor: float) -> list[TraceJob]:
    """``jobs`` with ``share`` of the whole-GPU ones elastic in ``1 : gpus × max_factor``."""
    out: list[TraceJob] = []
    whole = 0
    for job in jobs:
        if job.gpus < 1:  # a share of a GPU cannot be resized in whole GPUs
            out.append(job)
            continue
        chosen = math.floor((whole + 1) * share + 1e-9) > math.floor(whole * share + 1e-9)
        whole += 1
        if chosen:
            job = replace(job, elastic=(1, max(1, math.floor(job.gpus * max_factor + 1e-9))))
        out.append(job)
    return out
