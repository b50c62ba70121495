"""Which jobs make an elastic replay's tail: the slowest jobs elastic, each against rigid.

    python benchmarks/elastic_tail.py [--trace PATH] [--slice 103959/24] [--policy fifo]
        [--speedup linear] [--elastic 0.5:4] [--part second] [--top 0.01]

Replays one slice under one policy twice, as ``sim_elastic.py`` does (rigid, then a
share of the jobs elastic; 30 s per restart, 300 s between resizes), and prints the
slowest ``--top`` share of jobs elastic with, for each, its wait and JCT rigid, its wait,
run time, speed (its run time at the size it asked for over its run time here) and
shrinks elastic; then the change in JCT by kind of job
(elastic or rigid, GPUs asked for, run time under or over 10 h), summed over the jobs.

Trace: Microsoft Philly traces (Jeon et al., USENIX ATC'19), CC BY 4.0;
processed form from the Pollux artifact (petuum/adaptdl, osdi21-artifact).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from sim_elastic import RESIZE_EVERY, RESTART
from sim_policies import DEFAULT_TRACE, split

from jupyter_dlsched.sim import PHILLY_ATTRIBUTION, load_philly, simulate
from jupyter_dlsched.sim.elastic import make_elastic, parse_elastic

LONG = 10 * 3600.0  # a run time over this is "long" in the sums by kind


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--slice", default="103959/24", help="CLUSTER/GPUS")
    parser.add_argument("--policy", default="fifo")
    parser.add_argument("--speedup", default="linear")
    parser.add_argument("--elastic", default="0.5:4", help="SHARE:MAXFACTOR")
    parser.add_argument("--part", default="second", choices=("first", "second", "all"))
    parser.add_argument("--top", type=float, default=0.01, help="share of jobs listed")
    args = parser.parse_args()
    cluster, _, size = args.slice.partition("/")
    gpus = int(size)
    share, factor = parse_elastic(args.elastic)
    jobs = split(list(load_philly(args.trace, cluster=[cluster], max_gpus=gpus)), args.part)
    elastic = make_elastic(jobs, share, factor)
    spans = {j.id: j.elastic for j in elastic}
    params = {"restart_overhead": RESTART, "resize_every": RESIZE_EVERY}
    rigid = {j.id: j for j in simulate(jobs, args.policy, gpus, **params).jobs}
    flex = simulate(elastic, args.policy, gpus, speedup=args.speedup, **params)
    shrinks: dict[str, int] = {}
    for _, job_id, before, after in flex.resize_log:
        if after < before:
            shrinks[job_id] = shrinks.get(job_id, 0) + 1
    count = max(1, round(len(flex.jobs) * args.top))
    print(f"### {args.slice}, {args.policy}, {args.speedup}: the {count} slowest elastic\n")
    print(
        "| job | GPUs asked | elastic range | run time h | rigid wait h | rigid JCT h "
        "| elastic wait h | elastic run h | speed | shrinks | elastic JCT h |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for job in sorted(flex.jobs, key=lambda j: -j.jct)[:count]:
        before = rigid[job.id]
        span = spans[job.id]
        run = job.finish - job.first_start
        speed = job.duration / run if run > 0 else 0.0  # 1: as fast as at the size asked for
        print(
            f"| {job.id} | {job.gpus:g} | {'rigid' if span is None else f'{span[0]}-{span[1]}'} "
            f"| {job.duration / 3600:.1f} | {before.first_wait / 3600:.1f} "
            f"| {before.jct / 3600:.1f} | {job.first_wait / 3600:.1f} | {run / 3600:.1f} "
            f"| {speed:.0%} | {shrinks.get(job.id, 0)} | {job.jct / 3600:.1f} |"
        )
    kinds: dict[str, list[float]] = {}
    for job in flex.jobs:
        kind = (
            f"{'elastic' if spans[job.id] else 'rigid'} {job.gpus:g}-GPU "
            f"{'over' if job.duration > LONG else 'under'} 10 h"
        )
        row = kinds.setdefault(kind, [0, 0.0])
        row[0] += 1
        row[1] += (job.jct - rigid[job.id].jct) / 3600
    print("\n| jobs | count | JCT change in all, h |\n|---|---|---|")
    for kind, (n, change) in sorted(kinds.items()):
        print(f"| {kind} | {n:g} | {change:+,.0f} |")
    print(f"\nTrace: {PHILLY_ATTRIBUTION}")


if __name__ == "__main__":
    main()
