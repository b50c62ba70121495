"""Trace replay: compare scheduling policies on real GPU job traces.

The simulator drives the very policy objects the live scheduler uses
(``jupyter_dlsched.policy``) on a virtual clock.

>>> from jupyter_dlsched.sim import TraceJob, compare
>>> trace = [TraceJob("a", 0, 1, 30.0), TraceJob("b", 0, 1, 10.0)]
>>> [row["avg_jct"] for row in compare(trace, ["fifo", "sjf"], gpus=1, time_limits="exact").rows]
[35.0, 25.0]
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# Each name is imported from its module when first asked for: ``dlsched`` mounts the ``sim``
# command (``sim/cli.py``) on every run, and the engine and its policies stay unloaded
# unless a trace is replayed.
_HOMES = {
    "simulate": "engine",
    "jain_index": "metrics",
    "percentile": "metrics",
    "summarize": "metrics",
    "Comparison": "report",
    "compare": "report",
    "format_table": "report",
    "plot_jct_cdf": "report",
    "plot_utilisation": "report",
    "JobOutcome": "results",
    "SimResult": "results",
    "SimulationError": "results",
    "PHILLY_ATTRIBUTION": "trace",
    "Trace": "trace",
    "TraceError": "trace",
    "TraceJob": "trace",
    "load_csv": "trace",
    "load_philly": "trace",
    "load_trace": "trace",
}


def __getattr__(name: str) -> Any:
    try:
        home = _HOMES[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value


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
