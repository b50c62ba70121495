"""Side-by-side comparison of policies on one trace: a table and matplotlib plots."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..policy.base import Policy
from .engine import SimResult, simulate
from .metrics import summarize
from .trace import TraceJob

COLUMNS = (
    ("policy", "policy", "{}"),
    ("avg_jct", "avg JCT h", "{:.2f}"),
    ("p50_jct", "p50 JCT h", "{:.2f}"),
    ("p99_jct", "p99 JCT h", "{:.1f}"),
    ("avg_queue", "avg queue h", "{:.2f}"),
    ("makespan", "makespan d", "{:.1f}"),
    ("utilisation", "util", "{:.1%}"),
    ("preemptions_per_job", "preempt/job", "{:.2f}"),
    ("fairness", "fairness", "{:.3f}"),
)
_SCALE = {"avg_jct": 3600, "p50_jct": 3600, "p99_jct": 3600, "avg_queue": 3600, "makespan": 86400}


@dataclass
class Comparison:
    """Rows of figures (one dict per policy, in the order asked) and the replays behind them.

    ``str(comparison)`` is a text table; ``rows`` is plain data for JSON or pandas.
    """

    rows: list[dict[str, Any]]
    results: dict[str, SimResult] = field(default_factory=dict)

    def __str__(self) -> str:
        return format_table(self.rows)

    def plot_jct_cdf(self, ax: Any = None) -> Any:
        return plot_jct_cdf(list(self.results.values()), ax=ax)

    def plot_utilisation(self, ax: Any = None) -> Any:
        return plot_utilisation(list(self.results.values()), ax=ax)


def compare(
    jobs: Sequence[TraceJob],
    policies: Sequence[str | Policy],
    gpus: int,
    **options: Any,
) -> Comparison:
    """Replay ``jobs`` under each policy (a name or a policy object) and tabulate.

    ``options`` go to ``simulate`` (``nodes``, ``restart_overhead``, ``grace``,
    ``time_limits``, ``preemptible``).

    >>> from jupyter_dlsched.sim.trace import TraceJob
    >>> trace = [TraceJob("long", 0, 1, 100.0), TraceJob("short", 1, 1, 1.0)]
    >>> table = compare(trace, ["fifo", "srtf"], gpus=1, restart_overhead=0)
    >>> [(row["policy"], row["avg_jct"]) for row in table.rows]
    [('fifo', 100.0), ('srtf', 51.0)]
    """
    rows = []
    results: dict[str, SimResult] = {}
    for policy in policies:
        result = simulate(jobs, policy, gpus, **options)
        label = result.policy
        while label in results:
            label += "'"
        result.policy = label
        results[label] = result
        rows.append(summarize(result))
    return Comparison(rows, results)


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A fixed-width text table of ``summarize`` rows (times in hours, makespan in days)."""
    columns = [c for c in COLUMNS if any(row.get(c[0]) is not None for row in rows)]
    cells = [[title for _, title, _ in columns]]
    for row in rows:
        line = []
        for key, _, fmt in columns:
            value = row.get(key)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                line.append("-")
            else:
                line.append(fmt.format(value / _SCALE[key] if key in _SCALE else value))
        cells.append(line)
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in cells
    )


def plot_jct_cdf(results: Sequence[SimResult], ax: Any = None) -> Any:
    """The CDF of job completion times per policy, on a log time axis (legend in policy order)."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for result in results:
        jcts = sorted(max(j.jct, 1.0) / 3600 for j in result.jobs)
        n = len(jcts)
        ax.step(jcts, [(i + 1) / n for i in range(n)], where="post", label=result.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours)")
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return ax


def plot_utilisation(results: Sequence[SimResult], ax: Any = None, bins: int = 500) -> Any:
    """Busy GPUs over time per policy, as a fraction of the pool, averaged over ``bins`` spans."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3))
    for result in results:
        end = max((j.finish for j in result.jobs), default=0.0)
        if end <= 0:
            continue
        width = end / bins
        busy = _binned(result.timeline, end, bins)
        ax.step(
            [i * width / 86400 for i in range(bins)],
            [b / (width * result.gpus) for b in busy],
            where="post",
            label=result.policy,
        )
    ax.set_xlabel("days from the first submission")
    ax.set_ylabel("GPUs busy")
    ax.set_ylim(0, 1.05)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return ax


def _binned(timeline: Sequence[tuple[float, int]], end: float, bins: int) -> list[float]:
    """Busy GPU-seconds in each of ``bins`` equal spans of ``[0, end)``."""
    width = end / bins
    out = [0.0] * bins
    for (t0, busy), (t1, _) in zip(timeline, [*timeline[1:], (end, 0)], strict=True):
        i = min(int(t0 / width), bins - 1)
        while busy and t0 < t1:
            upto = t1 if i >= bins - 1 else min(t1, (i + 1) * width)
            out[i] += busy * max(0.0, upto - t0)
            t0, i = upto, i + 1
    return out
