"""Elastic jobs against rigid ones: every policy replayed on the Philly slices both ways.

    python benchmarks/sim_elastic.py [--trace PATH] [--elastic 0.5:4] [--speedup linear]
        [--speedup amdahl:0.05] [--part second] [--slice 0e4a51/16] [--json out.json]

For each published slice (virtual cluster ed69ec on 8 GPUs, 103959 on 24,
second half by default, as in ``sim_policies.py``; ``--slice CLUSTER/GPUS``,
repeated, replays others instead) and each policy, the same
jobs are replayed rigid and with a share of them elastic between 1 GPU and
their request × MAXFACTOR (``--elastic SHARE:MAXFACTOR``, the same spelling as
``dlsched sim``), under each speedup model. A resize costs the same 30 s as a
preemption's restart and no job is resized within 300 s of its last start or
resize. Printed: average JCT, the change against the same policy rigid
(target: at least 25 % lower), the 99th percentile JCT both ways, utilisation as useful work (the trace's GPUs ×
durations over GPUs × makespan, as ``dlsched sim`` reports it), GPU time held
(restart time and the extra GPU time of sub-linear speedup included) and
resizes per elastic job.

Trace: Microsoft Philly traces (Jeon et al., USENIX ATC'19), CC BY 4.0;
processed form from the Pollux artifact (petuum/adaptdl, osdi21-artifact).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

from sim_policies import DEFAULT_TRACE, split

from jupyter_dlsched.policy.speedup import parse_speedup
from jupyter_dlsched.sim import PHILLY_ATTRIBUTION, load_philly, simulate, summarize
from jupyter_dlsched.sim.elastic import make_elastic, parse_elastic

SLICES = [("ed69ec", 8), ("103959", 24)]
POLICIES = ["fifo", "fifo-ff", "priority", "sjf", "sjf-gputime", "fair", "las", "gittins", "srtf"]
TARGET = 0.25  # at least this much lower average JCT than the same policy rigid
RESIZE_EVERY = 300.0
RESTART = 30.0


def row(jobs: list, policy: str, gpus: int, speedup: str | None) -> dict[str, Any]:
    began = time.process_time()
    result = simulate(
        jobs,
        policy,
        gpus,
        restart_overhead=RESTART,
        resize_every=RESIZE_EVERY,
        speedup=speedup or "linear",
    )
    out = summarize(result)
    makespan = out["makespan"]
    out["held"] = result.busy_gpu_seconds / (gpus * makespan) if makespan else 0.0
    elastic = sum(1 for j in jobs if j.elastic)
    out["resizes_per_elastic_job"] = len(result.resize_log) / elastic if elastic else 0.0
    out["cpu_s"] = time.process_time() - began
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--elastic", default="0.5:4", help="SHARE:MAXFACTOR (default 0.5:4)")
    parser.add_argument("--speedup", action="append", help="linear, amdahl:F, table:... (repeat)")
    parser.add_argument("--part", default="second", choices=("first", "second", "all"))
    parser.add_argument("--slice", action="append", help="CLUSTER/GPUS (repeat; default both)")
    parser.add_argument("--json", type=Path, help="also write every row here")
    args = parser.parse_args()
    share, factor = parse_elastic(args.elastic)
    models = args.speedup or ["linear", "amdahl:0.05"]
    for model in models:
        parse_speedup(model)
    print(
        f"Python {platform.python_version()}, {platform.machine()}; elastic share {share:g}, "
        f"1 GPU to {factor:g} x request; resize every {RESIZE_EVERY:g} s, {RESTART:g} s each"
    )
    report: dict[str, Any] = {"elastic": args.elastic, "part": args.part, "slices": {}}
    slices = SLICES
    if args.slice:
        slices = [(c, int(g)) for c, _, g in (text.partition("/") for text in args.slice)]
    for cluster, gpus in slices:
        jobs = split(list(load_philly(args.trace, cluster=[cluster], max_gpus=gpus)), args.part)
        elastic = make_elastic(jobs, share, factor)
        n = sum(1 for j in elastic if j.elastic)
        print(f"\n### {cluster} on {gpus} GPUs, {args.part} half ({len(jobs)} jobs, {n} elastic)\n")
        print(
            "| policy | speedup | rigid avg JCT h | elastic avg JCT h | change | rigid p99 h "
            "| elastic p99 h | rigid util | elastic util | elastic GPU time held "
            "| resizes / elastic job | target |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        rows = []
        for policy in POLICIES:
            rigid = row(jobs, policy, gpus, None)
            for model in models:
                flex = row(elastic, policy, gpus, model)
                change = flex["avg_jct"] / rigid["avg_jct"] - 1.0
                met = "met" if change <= -TARGET else "**missed**"
                print(
                    f"| {policy} | {model} | {rigid['avg_jct'] / 3600:.2f} | "
                    f"{flex['avg_jct'] / 3600:.2f} | {change:+.1%} | {rigid['p99_jct'] / 3600:.1f} | "
                    f"{flex['p99_jct'] / 3600:.1f} | {rigid['utilisation']:.1%} | "
                    f"{flex['utilisation']:.1%} | {flex['held']:.1%} | "
                    f"{flex['resizes_per_elastic_job']:.2f} | {met} |",
                    flush=True,
                )
                rows.append({"policy": policy, "speedup": model, "rigid": rigid, "elastic": flex})
        report["slices"][f"{cluster}/{gpus}"] = rows
    print(f"\nTrace: {PHILLY_ATTRIBUTION}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
