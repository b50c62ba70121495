"""Trace replay: compare scheduling policies on real GPU job traces.

The simulator drives the very policy objects the live scheduler uses
(``jupyter_dlsched.policy``) on a virtual clock.

>>> from jupyter_dlsched.sim import TraceJob, compare
>>> trace = [TraceJob("a", 0, 1, 30.0), TraceJob("b", 0, 1, 10.0)]
>>> [row["avg_jct"] for row in compare(trace, ["fifo", "sjf"], gpus=1, time_limits="exact").rows]
[35.0, 25.0]
"""

from .engine import simulate
from .metrics import jain_index, percentile, summarize
from .report import Comparison, compare, format_table, plot_jct_cdf, plot_utilisation
from .results import JobOutcome, SimResult, SimulationError
from .trace import (
    PHILLY_ATTRIBUTION,
    Trace,
    TraceError,
    TraceJob,
    load_csv,
    load_philly,
    load_trace,
)

__all__ = [
    "PHILLY_ATTRIBUTION",
    "Comparison",
    "JobOutcome",
    "SimResult",
    "SimulationError",
    "Trace",
    "TraceError",
    "TraceJob",
    "compare",
    "format_table",
    "jain_index",
    "load_csv",
    "load_philly",
    "load_trace",
    "percentile",
    "plot_jct_cdf",
    "plot_utilisation",
    "simulate",
    "summarize",
]
