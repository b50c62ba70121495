"""``dlsched sim TRACE --gpus N --policy a,b,c``: compare policies on a trace from the shell.

``jupyter_dlsched.cli`` mounts this with ``add_parser(subparsers)``, which sets
``run`` as the command's handler, and calls ``args.run(args)``.

Options are read as text and checked here rather than by ``argparse`` types, so
that every bad value ends in one line, ``dlsched sim: <what is wrong>``, and
exit status 2, like every other input error of the command.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..vocab.errors import DlschedError
from .elastic import make_elastic, parse_elastic
from .gpus import MAX_GPUS
from .trace import PHILLY_ATTRIBUTION, Trace, TraceJob, load_trace

if TYPE_CHECKING:
    from ..policy.base import Policy

# ``dlsched`` mounts this command on every run; the policies (and the engine) are imported
# when a trace is replayed. The names the help lists are ``policy.POLICIES``'s (a test
# holds them equal).
POLICY_NAMES = (
    "priority",
    "fifo",
    "fifo-ff",
    "sjf",
    "sjf-gputime",
    "fair",
    "las",
    "gittins",
    "srtf",
)
DEFAULT_POLICIES = "fifo,fifo-ff,priority,sjf,las,gittins,srtf"
# replay-only variants, named for what they know: the replayed trace's own size distribution
ORACLES = ("gittins-oracle",)


class SimOptionError(DlschedError, ValueError):
    """A ``dlsched sim`` option has a value the simulator cannot use; the message names it."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``sim`` command to an ``argparse`` sub-parser collection; it runs ``run``."""
    p = subparsers.add_parser(
        "sim",
        help="replay a job trace under several policies and compare them",
        description=(
            "Replay TRACE (the Philly trace format, or CSV rows "
            "submit_time,num_gpus,duration[,owner,priority]) on a virtual clock and print "
            "one row per policy: average / p50 / p99 job completion time and time spent "
            "waiting (in seconds, minutes or hours, whichever fits), makespan, GPU "
            "utilisation (useful work), preemptions per job and, when jobs have owners, "
            "Jain's fairness index."
        ),
    )
    p.add_argument("trace", help="trace file (Philly CSV or plain CSV)")
    p.add_argument("--gpus", required=True, help="GPUs in the simulated pool (>= 1)")
    p.add_argument(
        "--policy",
        default=DEFAULT_POLICIES,
        help=(
            f"comma-separated policies, from {', '.join(POLICY_NAMES)}, or {', '.join(ORACLES)} "
            f"(gittins built from the replayed trace's sizes) (default: {DEFAULT_POLICIES})"
        ),
    )
    p.add_argument("--nodes", default="1", help="split the GPUs evenly over this many nodes")
    p.add_argument("--cluster", help="Philly virtual cluster(s) to keep, comma-separated")
    p.add_argument("--start", help="keep jobs submitted from this time (2017-10-01 [HH:MM:SS])")
    p.add_argument("--end", help="keep jobs submitted before this time")
    p.add_argument(
        "--max-gpus", help="drop jobs asking for more GPUs (default: --gpus); drops are reported"
    )
    p.add_argument("--sample", help="keep this fraction (<=1) or count (>1) of jobs")
    p.add_argument("--seed", default="0", help="seed of --sample (default 0)")
    p.add_argument(
        "--restart-overhead",
        default="30",
        help="seconds a preempted job loses when it starts again (default 30)",
    )
    p.add_argument(
        "--grace",
        default="0",
        help="seconds a preempted job keeps its GPUs before letting go (default 0)",
    )
    p.add_argument(
        "--time-limits",
        default="none",
        help=(
            "time limits jobs declare: none (the default, as live users mostly do: sjf and "
            "priority learn sizes from finished jobs), exact (their duration: an oracle, "
            "labelled so), or a factor like 2"
        ),
    )
    p.add_argument(
        "--elastic",
        metavar="SHARE[:MAXFACTOR]",
        help=(
            "treat this share of jobs (0-1, spread evenly) as elastic between 1 GPU and "
            "their request x MAXFACTOR (default 2), resized by checkpoint and restart"
        ),
    )
    p.add_argument(
        "--speedup",
        default="linear",
        help=(
            "how elastic jobs speed up with GPUs: linear (default), amdahl:SERIAL_FRACTION, "
            "or table:1=1,2=1.8,4=3.1"
        ),
    )
    p.add_argument(
        "--resize-every",
        default="300",
        help="seconds between two resizes of one elastic job (default 300)",
    )
    p.add_argument(
        "--gittins-prior",
        action="store_true",
        help="gittins keeps its built-in size prior and learns nothing from finished jobs",
    )
    p.add_argument(
        "--eta",
        action="store_true",
        help=(
            "also forecast each job's start when it is submitted, as the live scheduler does, "
            "and report the share of jobs that started by their P80 estimate"
        ),
    )
    p.add_argument("--plot", metavar="PNG", help="also save JCT CDFs and utilisation to PNG")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(run=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Run ``dlsched sim`` with parsed ``args``; 0 on success, 2 on a usage or input error."""
    try:
        return _run(args)
    except DlschedError as exc:
        print(f"dlsched sim: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    from ..policy.speedup import parse_speedup
    from .report import compare

    # every option is checked before the trace is read, so a typo costs no loading time
    gpus = _whole(args.gpus, "--gpus", minimum=1)
    if gpus > MAX_GPUS:
        raise SimOptionError(f"--gpus {gpus} is more than the {MAX_GPUS} GPUs the simulator models")
    nodes = _whole(args.nodes, "--nodes", minimum=1)
    if gpus % nodes:
        raise SimOptionError(f"--nodes {nodes} does not split --gpus {gpus} evenly")
    max_gpus = gpus if args.max_gpus is None else _whole(args.max_gpus, "--max-gpus", minimum=1)
    if max_gpus > gpus:
        raise SimOptionError(
            f"--max-gpus {max_gpus} is more than --gpus {gpus}: such jobs could never start; "
            f"give at most {gpus}"
        )
    restart_overhead = _seconds(args.restart_overhead, "--restart-overhead")
    grace = _seconds(args.grace, "--grace")
    time_limits = _time_limits(args.time_limits)
    sample = None if args.sample is None else _sample(args.sample)
    seed = _whole(args.seed, "--seed", minimum=None)
    names = _policy_names(args.policy)
    elastic = None if args.elastic is None else parse_elastic(args.elastic)
    speedup = parse_speedup(args.speedup)
    resize_every = _seconds(args.resize_every, "--resize-every")
    if args.plot:
        _check_plot_path(args.plot)

    clusters = [c.strip() for c in (args.cluster or "").split(",") if c.strip()] or None
    jobs = load_trace(
        args.trace,
        cluster=clusters,
        start=args.start,
        end=args.end,
        max_gpus=max_gpus,
        sample=sample,
        seed=seed,
    )
    dropped = jobs.dropped_lines()
    if not jobs:
        raise SimOptionError(_nothing_left(args, jobs))
    replayed: list[TraceJob] = jobs if elastic is None else make_elastic(jobs, *elastic)
    policies = [_policy(name, jobs, args.gittins_prior) for name in names]
    for policy in policies:
        if hasattr(policy, "restart_cost"):  # weigh preemptions by the replay's restart cost
            policy.restart_cost = restart_overhead
    began = time.perf_counter()
    table = compare(
        replayed,
        policies,
        gpus,
        nodes=nodes,
        restart_overhead=restart_overhead,
        grace=grace,
        time_limits=time_limits,
        resize_every=resize_every,
        speedup=speedup,
        estimates=args.eta,
    )
    seconds = time.perf_counter() - began
    philly = jobs.format == "philly"
    notes = _blind_learners(replayed, policies, time_limits)
    if args.json:
        out: dict[str, Any] = {
            "trace": args.trace,
            "jobs": len(jobs),
            "gpus": gpus,
            "dropped": [{"jobs": n, "reason": why} for why, n in jobs.dropped.items()],
            "elastic": None
            if elastic is None
            else {"share": elastic[0], "max_factor": elastic[1], "speedup": speedup.name},
            "rows": table.rows,
            "notes": notes,
        }
        if philly:
            out["attribution"] = PHILLY_ATTRIBUTION
        print(json.dumps(out, indent=2))
    else:
        print(f"{_count(len(jobs), 'job')} on {_count(gpus, 'GPU')}, replayed in {seconds:.1f} s")
        if elastic is not None:
            n = sum(1 for j in replayed if j.elastic)
            print(
                f"{_count(n, 'job')} elastic (1 GPU to {elastic[1]:g} x request), speedup "
                f"{speedup.name}, resized at most every {resize_every:g} s, "
                f"each resize costing {restart_overhead:g} s"
            )
        for line in dropped:
            print(line)
        print(table)
        for line in notes:
            print(line)
        if philly:
            print(f"Trace: {PHILLY_ATTRIBUTION}")
    if args.plot:
        _save_plot(table, args.plot)
    return 0


def _blind_learners(
    jobs: list[TraceJob], policies: list[Policy], time_limits: str | float | None
) -> list[str]:
    """A line for each ``sjf`` that learns sizes from a trace whose jobs it cannot tell
    apart: run times are learnt by owner, name and GPU count, so where every job shares
    all three each gets the same estimate and the order is submit order (``fifo-ff``)."""
    from ..policy import SjfPolicy

    if time_limits is not None or len({(j.owner, j.name, j.gpus) for j in jobs}) > 1:
        return []
    return [
        f"{policy.name}: every job has the same owner, name and GPU count, so the run times "
        "it learns cannot tell jobs apart; it orders them as fifo-ff does"
        for policy in policies
        if isinstance(policy, SjfPolicy) and policy.learn_sizes
    ]


def _nothing_left(args: argparse.Namespace, jobs: Trace) -> str:
    if jobs.dropped:
        return f"no jobs in {args.trace} left to replay: " + "; ".join(jobs.dropped_lines())
    chosen = [
        f"{option} {value}"
        for option, value in (
            ("--cluster", args.cluster),
            ("--start", args.start),
            ("--end", args.end),
        )
        if value
    ]
    if chosen:
        return f"no jobs in {args.trace} match {', '.join(chosen)}"
    return f"{args.trace} holds no jobs"


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def _number(text: str, option: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SimOptionError(f"{option} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise SimOptionError(f"{option} {text} is invalid: expected a finite number")
    return value


def _whole(text: str, option: str, minimum: int | None) -> int:
    value = _number(text, option)
    if not value.is_integer() or (minimum is not None and value < minimum):
        at_least = "" if minimum is None else f" >= {minimum}"
        raise SimOptionError(f"{option} {text} is invalid: expected a whole number{at_least}")
    return int(value)


def _seconds(text: str, option: str) -> float:
    value = _number(text, option)
    if value < 0:
        raise SimOptionError(f"{option} {text} is invalid: expected seconds >= 0")
    return value


def _time_limits(text: str) -> str | float | None:
    if text in ("exact", "none"):
        return None if text == "none" else text
    try:
        factor = float(text)
    except ValueError:
        factor = math.nan
    if not math.isfinite(factor) or factor <= 0:
        raise SimOptionError(
            f"--time-limits {text!r} is invalid: expected exact, none, or a factor > 0 such as 2"
        )
    return factor


def _sample(text: str) -> float | int:
    value = _number(text, "--sample")
    if value <= 0 or (value > 1 and not value.is_integer()):
        raise SimOptionError(
            f"--sample {text} is invalid: expected a fraction in (0, 1] or a whole count > 1"
        )
    return value if value <= 1 else int(value)


def _policy_names(text: str) -> list[str]:
    from ..policy import POLICIES

    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise SimOptionError(f"--policy names no policy; choose from {', '.join(POLICIES)}")
    unknown = [n for n in names if n not in POLICIES and n not in ORACLES]
    if unknown:
        raise SimOptionError(
            f"--policy {unknown[0]!r} is not a policy; choose from {', '.join(POLICIES)}"
        )
    return names


def _check_plot_path(text: str) -> None:
    from matplotlib.backend_bases import FigureCanvasBase

    path = Path(text)
    if path.is_dir():
        raise SimOptionError(f"--plot {text} is a folder; give a file such as {path / 'sim.png'}")
    folder = path.parent
    if not folder.is_dir():
        raise SimOptionError(f"--plot {text}: the folder {folder} does not exist; create it first")
    kinds = FigureCanvasBase.get_supported_filetypes()
    suffix = path.suffix.lstrip(".").lower()
    if suffix and suffix not in kinds:
        raise SimOptionError(
            f"--plot {text}: matplotlib cannot write .{suffix} files; use one of "
            + ", ".join(f".{k}" for k in sorted(kinds))
        )


def _policy(name: str, jobs: list[TraceJob], prior: bool) -> Policy:
    from ..policy import GittinsPolicy, get_policy

    if name == "gittins-oracle":
        # knows the distribution of the very jobs it replays: a bracket, never a default
        return GittinsPolicy(sizes=[j.gpu_time for j in jobs], learn_sizes=False, name=name)
    if name == "gittins" and prior:
        return GittinsPolicy(learn_sizes=False, name="gittins (prior only)")
    return get_policy(name)


def _save_plot(table: Any, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 8))
    table.plot_jct_cdf(ax=top)
    table.plot_utilisation(ax=bottom)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise SimOptionError(f"--plot {path}: cannot write it ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)
