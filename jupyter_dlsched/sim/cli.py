"""``dlsched sim TRACE --gpus N --policy a,b,c``: compare policies on a trace from the shell.

``jupyter_dlsched.cli`` mounts this with ``add_parser(subparsers)`` and calls
``run(args)``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ..errors import DlschedError
from ..policy import POLICIES, GittinsPolicy, get_policy
from ..policy.base import Policy
from .report import compare
from .trace import PHILLY_ATTRIBUTION, TraceJob, load_trace

DEFAULT_POLICIES = "fifo,fifo-ff,priority,sjf,las,gittins,srtf"


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``sim`` command to an ``argparse`` sub-parser collection."""
    p = subparsers.add_parser(
        "sim",
        help="replay a job trace under several policies and compare them",
        description=(
            "Replay TRACE (the Philly trace format, or CSV rows "
            "submit_time,num_gpus,duration[,owner,priority]) on a virtual clock and print "
            "one row per policy: average / p50 / p99 job completion time and queueing delay "
            "(hours), makespan (days), GPU utilisation, preemptions per job and, when jobs "
            "have owners, Jain's fairness index."
        ),
    )
    p.add_argument("trace", help="trace file (Philly CSV or plain CSV)")
    p.add_argument("--gpus", type=int, required=True, help="GPUs in the simulated pool")
    p.add_argument(
        "--policy",
        default=DEFAULT_POLICIES,
        help=f"comma-separated policies, from {', '.join(POLICIES)} (default: {DEFAULT_POLICIES})",
    )
    p.add_argument("--nodes", type=int, default=1, help="split the GPUs over this many nodes")
    p.add_argument("--cluster", help="Philly virtual cluster(s) to keep, comma-separated")
    p.add_argument("--start", help="keep jobs submitted from this time (2017-10-01 [HH:MM:SS])")
    p.add_argument("--end", help="keep jobs submitted before this time")
    p.add_argument("--max-gpus", type=int, help="drop jobs asking for more GPUs (default: --gpus)")
    p.add_argument("--sample", type=float, help="keep this fraction (<=1) or count (>1) of jobs")
    p.add_argument("--seed", type=int, default=0, help="seed of --sample (default 0)")
    p.add_argument(
        "--restart-overhead",
        type=float,
        default=30.0,
        help="seconds a preempted job loses when it starts again (default 30)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=0.0,
        help="seconds a preempted job keeps its GPUs before letting go (default 0)",
    )
    p.add_argument(
        "--time-limits",
        default="exact",
        help="time limits jobs declare: exact (their duration), none, or a factor like 2",
    )
    p.add_argument(
        "--gittins-prior",
        action="store_true",
        help="build gittins from its built-in size prior, not from the trace's job sizes",
    )
    p.add_argument("--plot", metavar="PNG", help="also save JCT CDFs and utilisation to PNG")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``dlsched sim`` with parsed ``args``; 0 on success, 2 on a usage error."""
    try:
        return _run(args)
    except DlschedError as exc:
        print(f"dlsched sim: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    filters: dict[str, Any] = {"max_gpus": args.max_gpus or args.gpus, "seed": args.seed}
    if args.cluster:
        filters["cluster"] = args.cluster.split(",")
    if args.start:
        filters["start"] = args.start
    if args.end:
        filters["end"] = args.end
    if args.sample is not None:
        filters["sample"] = args.sample if args.sample <= 1 else int(args.sample)
    jobs = load_trace(args.trace, **filters)
    if not jobs:
        print("dlsched sim: no jobs in the trace match the filters", file=sys.stderr)
        return 2
    names = [n.strip() for n in args.policy.split(",") if n.strip()]
    policies = [_policy(name, jobs, args.gittins_prior) for name in names]
    limits = args.time_limits
    time_limits: str | float | None = (
        None if limits == "none" else limits if limits == "exact" else float(limits)
    )
    began = time.perf_counter()
    table = compare(
        jobs,
        policies,
        args.gpus,
        nodes=args.nodes,
        restart_overhead=args.restart_overhead,
        grace=args.grace,
        time_limits=time_limits,
    )
    seconds = time.perf_counter() - began
    philly = any(j.id.startswith("philly-") for j in jobs[:1])
    if args.json:
        out = {"trace": args.trace, "jobs": len(jobs), "gpus": args.gpus, "rows": table.rows}
        if philly:
            out["attribution"] = PHILLY_ATTRIBUTION
        print(json.dumps(out, indent=2))
    else:
        print(f"{len(jobs)} jobs on {args.gpus} GPUs, replayed in {seconds:.1f} s")
        print(table)
        if philly:
            print(f"Trace: {PHILLY_ATTRIBUTION}")
    if args.plot:
        _save_plot(table, args.plot)
    return 0


def _policy(name: str, jobs: list[TraceJob], prior: bool) -> Policy:
    if name == "gittins" and not prior:
        return GittinsPolicy(sizes=[j.gpu_time for j in jobs])
    return get_policy(name)


def _save_plot(table: Any, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 8))
    table.plot_jct_cdf(ax=top)
    table.plot_utilisation(ax=bottom)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
