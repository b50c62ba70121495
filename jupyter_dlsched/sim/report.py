"""Side-by-side comparison of policies on one trace: a table and matplotlib plots."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..policy.base import Policy
from .engine import simulate
from .metrics import summarize
from .results import SimResult
from .trace import TraceJob

COLUMNS = (
    ("policy", "policy", "{}"),
    ("avg_jct", "avg JCT {jct}", "{:.2f}"),
    ("p50_jct", "p50 JCT {jct}", "{:.2f}"),
    ("p99_jct", "p99 JCT {jct}", "{:.1f}"),
    ("avg_queue", "avg queue {jct}", "{:.2f}"),
    ("makespan", "makespan {span}", "{:.1f}"),
    ("utilisation", "util", "{:.1%}"),
    ("preemptions_per_job", "preempt/job", "{:.2f}"),
    ("fairness", "fairness", "{:.3f}"),
    ("eta_p80_hit", "start<=P80", "{:.1%}"),
    ("eta_median_error", "ETA err {jct}", "{:.2f}"),
    ("eta_sharpness", "ETA err/wait", "{:.2f}"),
    ("eta_uncertain", "uncertain", "{:.1%}"),
    ("eta_given_p80_hit", "given<=P80", "{:.1%}"),
    ("eta_given_sharpness", "given err/wait", "{:.2f}"),
    ("eta_deep", "too deep", "{:.1%}"),
)
_TIMES = ("avg_jct", "p50_jct", "p99_jct", "avg_queue", "eta_median_error")
# (unit, seconds): the largest unit in which the typical figure is still at least 2
UNITS = (("d", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0))


def time_unit(seconds: float, largest: str = "h") -> tuple[str, float]:
    """The unit that fits ``seconds``: ``s``, ``min``, ``h`` (or ``d`` when allowed).

    >>> time_unit(45.0), time_unit(600.0), time_unit(36000.0), time_unit(9e5, largest="d")
    (('s', 1.0), ('min', 60.0), ('h', 3600.0), ('d', 86400.0))
    """
    allowed = UNITS[[u for u, _ in UNITS].index(largest) :]
    for unit, size in allowed:
        if seconds >= 2 * size:
            return unit, size
    return allowed[-1]


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
    ``time_limits``, ``preemptible``, ``estimates``).

    >>> from jupyter_dlsched.sim.trace import TraceJob
    >>> trace = [TraceJob("long", 0, 1, 100.0), TraceJob("short", 1, 1, 1.0)]
    >>> table = compare(trace, ["fifo", "srtf"], gpus=1, restart_overhead=0)
    >>> [(row["policy"], row["avg_jct"]) for row in table.rows]
    [('fifo', 100.0), ('srtf (oracle)', 51.0)]
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
    """A fixed-width text table of ``summarize`` rows, in units that fit the figures.

    Completion and queueing times share one unit (seconds, minutes or hours,
    chosen from the smallest average JCT), the makespan its own (up to days),
    and the titles say which: ``avg JCT min``, ``makespan h``.
    """
    columns = [c for c in COLUMNS if any(row.get(c[0]) is not None for row in rows)]
    typical = [r["avg_jct"] for r in rows if _finite(r.get("avg_jct"))]
    spans = [r["makespan"] for r in rows if _finite(r.get("makespan"))]
    jct_unit, jct_size = time_unit(min(typical, default=0.0))
    span_unit, span_size = time_unit(max(spans, default=0.0), largest="d")
    scale = {key: jct_size for key in _TIMES}
    scale["makespan"] = span_size
    cells = [[title.format(jct=jct_unit, span=span_unit) for _, title, _ in columns]]
    for row in rows:
        line = []
        for key, _, fmt in columns:
            value = row.get(key)
            if value is None or (isinstance(value, float) and math.isnan(value)):
                line.append("-")
            else:
                line.append(_cell(fmt, value / scale[key] if key in scale else value))
        cells.append(line)
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in cells
    )


# past this a figure is shown with 3 significant digits, so one absurd job keeps the table narrow
_HUGE = 1e7


def _cell(fmt: str, value: Any) -> str:
    """``value`` in ``fmt``, or as ``2.78e+296`` when it is too large for fixed notation.

    >>> _cell("{:.2f}", 12.345), _cell("{:.2f}", 2.7e296), _cell("{:.1%}", 0.5)
    ('12.35', '2.7e+296', '50.0%')
    """
    if isinstance(value, float) and (abs(value) >= _HUGE or math.isinf(value)) and "%" not in fmt:
        return f"{value:.3g}"
    return fmt.format(value)


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


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


def _binned(timeline: Sequence[tuple[float, float]], end: float, bins: int) -> list[float]:
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
