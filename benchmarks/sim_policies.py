"""Every built-in policy replayed on the Philly trace, with fifo and oracle srtf as brackets.

    python benchmarks/sim_policies.py [--trace PATH] [--workers 2] [--json out.json]
        [--scenario ed69ec] [--part first|second|all] [--skip-speed | --speed-only]

Scenarios: virtual cluster ed69ec on 8 GPUs, virtual cluster 103959 on 24 GPUs,
the whole trace on 512 GPUs, each split in time: parameters were chosen on the
first half, the second half is what is reported. Jobs declare no time
limit, as live users mostly do: sjf and priority's backfill use run times
learnt from jobs finished before each decision; preemption costs a 30 s
restart. gittins learns sizes online
from jobs finished before each decision; gittins-oracle is built from the
replayed jobs' size distribution and srtf reads true remaining times (both
labelled). Also measures the speed of the simulator: the whole trace under
every policy, one after another in one process, in CPU seconds.

Trace: Microsoft Philly traces (Jeon et al., USENIX ATC'19), CC BY 4.0;
processed form from the Pollux artifact (petuum/adaptdl, osdi21-artifact).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import time
from pathlib import Path
from typing import Any

from jupyter_dlsched.policy import GittinsPolicy, get_policy
from jupyter_dlsched.sim import PHILLY_ATTRIBUTION, TraceJob, load_philly, simulate, summarize

# gittins learns sizes online; gittins+guard adds the oldest-first lane; gittins-oracle is
# built from the replayed jobs' own size distribution (a bracket, never a default)
GUARDED = "gittins+guard"
ORACLE = "gittins-oracle"
POLICIES = [
    "fifo",
    "fifo-ff",
    "priority",
    "sjf",
    "sjf-gputime",
    "fair",
    "las",
    "gittins",
    GUARDED,
    ORACLE,
    "srtf",
]
# what each policy knows of durations: the targets compare only those that know nothing
# (sjf and priority learn run times from finished jobs: jobs declare no time limit)
BLIND = ["fifo", "fifo-ff", "priority", "sjf", "sjf-gputime", "fair", "las", "gittins", GUARDED]
SCENARIOS = [("ed69ec", "ed69ec", 8), ("103959", "103959", 24), ("whole trace", None, 512)]
PARTS = ("first", "second", "all")
# the guard's parameters, chosen on the first half of each slice (docs/policies.md)
GUARD = {"promote_after": 3 * 86400, "promote_share": 0.5}
DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared/traces/philly.csv"


def split(jobs: list[TraceJob], part: str) -> list[TraceJob]:
    """The first or second half of ``jobs`` by submit time (the second shifted to start at 0)."""
    if part == "all":
        return jobs
    middle = jobs[len(jobs) // 2].submit
    if part == "first":
        return [j for j in jobs if j.submit < middle]
    later = [j for j in jobs if j.submit >= middle]
    t0 = later[0].submit
    return [
        TraceJob(j.id, j.submit - t0, j.gpus, j.duration, j.owner, j.priority, j.name)
        for j in later
    ]


def build(name: str, jobs: list[TraceJob]) -> Any:
    if name == GUARDED:
        return GittinsPolicy(name=GUARDED, **GUARD)  # type: ignore[arg-type]
    if name == ORACLE:
        return GittinsPolicy(sizes=[j.gpu_time for j in jobs], learn_sizes=False, name=ORACLE)
    return get_policy(name)


def run_one(task: tuple[str, str | None, int, str, str, str]) -> dict[str, Any]:
    scenario, cluster, gpus, policy_name, trace, part = task
    jobs = split(load_philly(trace, cluster=cluster, max_gpus=gpus), part)
    policy = build(policy_name, jobs)
    began, began_cpu = time.perf_counter(), time.process_time()
    result = simulate(jobs, policy, gpus)
    row = summarize(result)
    row.update(
        name=policy_name,
        scenario=scenario,
        part=part,
        gpus=gpus,
        seconds=time.perf_counter() - began,
        cpu_seconds=time.process_time() - began_cpu,
    )
    return row


def speed(trace: str) -> tuple[dict[str, float], dict[str, float]]:
    """Wall-clock and CPU seconds of whole-trace replays of every policy, one after another."""
    jobs = load_philly(trace, max_gpus=512)
    wall, cpu = {}, {}
    for name in POLICIES:
        began, began_cpu = time.perf_counter(), time.process_time()
        simulate(jobs, build(name, jobs), 512)
        wall[name] = time.perf_counter() - began
        cpu[name] = time.process_time() - began_cpu
    return wall, cpu


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| policy | avg JCT h | p50 JCT h | p99 JCT h | avg queue h | makespan d "
        "| util | preempt/job | fairness | replay CPU s |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        fairness = "-" if r["fairness"] is None else f"{r['fairness']:.3f}"
        lines.append(
            f"| {r['policy']} | {r['avg_jct'] / 3600:.2f} | {r['p50_jct'] / 3600:.2f} "
            f"| {r['p99_jct'] / 3600:.1f} | {r['avg_queue'] / 3600:.2f} "
            f"| {r['makespan'] / 86400:.1f} | {r['utilisation']:.1%} "
            f"| {r['preemptions_per_job']:.2f} | {fairness} | {r['cpu_seconds']:.1f} |"
        )
    return "\n".join(lines)


def targets(rows: list[dict[str, Any]]) -> str:
    """The issue's targets on one slice, each said as met or missed."""
    by = {r["name"]: r for r in rows}
    srtf, fifo, priority, first_fit = by["srtf"], by["fifo"], by["priority"], by["fifo-ff"]
    blind = [by[n] for n in BLIND if n in by]
    best = min(blind, key=lambda r: r["avg_jct"])
    ratio = best["avg_jct"] / srtf["avg_jct"]
    tail_ok = best["p99_jct"] <= fifo["p99_jct"]
    both = [
        r
        for r in blind
        if r["avg_jct"] <= 1.25 * srtf["avg_jct"] and r["p99_jct"] <= fifo["p99_jct"]
    ]
    ok = priority["avg_jct"] <= first_fit["avg_jct"] * (1 + 1e-9)
    return (
        f"best blind policy by avg JCT: {best['name']}, {ratio:.2f} x srtf "
        f"({'met' if ratio <= 1.25 else 'missed'} <= 1.25), p99 {best['p99_jct'] / 3600:.1f} h "
        f"vs fifo {fifo['p99_jct'] / 3600:.1f} h ({'met' if tail_ok else 'missed'}); "
        f"blind policies meeting both: {', '.join(r['name'] for r in both) or 'none'}; "
        f"priority avg JCT {priority['avg_jct'] / 3600:.2f} h vs fifo-ff "
        f"{first_fit['avg_jct'] / 3600:.2f} h ({'met' if ok else 'missed'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(DEFAULT_TRACE))
    parser.add_argument("--workers", type=int, default=2, help="processes for the replays")
    parser.add_argument("--json", help="also write all figures to this file, row by row")
    parser.add_argument("--skip-speed", action="store_true", help="do not measure the speed")
    parser.add_argument("--speed-only", action="store_true", help="only measure the speed")
    parser.add_argument(
        "--scenario",
        action="append",
        choices=[name for name, _, _ in SCENARIOS],
        help="only this scenario (repeatable)",
    )
    parser.add_argument(
        "--part",
        action="append",
        choices=PARTS,
        help="half of each slice by submit time: first (parameters were chosen on it), "
        "second (reported), all (default: first and second)",
    )
    args = parser.parse_args()
    parts = args.part or ["first", "second"]

    print(
        f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        flush=True,
    )
    report: dict[str, Any] = {"scenarios": {}}
    if not args.skip_speed:
        load = os.getloadavg()[0]  # other work on the machine slows the wall clock, not CPU time
        took, cpu = speed(args.trace)
        report.update(speed_seconds=took, speed_cpu_seconds=cpu)
        print(
            "speed: whole trace (82,247 jobs, 512 GPUs), wall (CPU) seconds: "
            + ", ".join(f"{name} {took[name]:.1f} ({cpu[name]:.1f})" for name in took)
            + f"; total {sum(took.values()):.1f} ({sum(cpu.values()):.1f}, target <= 60 CPU s: "
            + f"{'met' if sum(cpu.values()) <= 60 else 'missed'}); "
            + f"1-minute load average before: {load:.1f}",
            flush=True,
        )
    if args.speed_only:
        return
    scenarios = [s for s in SCENARIOS if not args.scenario or s[0] in args.scenario]
    tasks = [
        (scenario, cluster, gpus, policy, args.trace, part)
        for scenario, cluster, gpus in scenarios
        for part in parts
        for policy in POLICIES
    ]
    # small scenarios first: a cut-short run still says much
    tasks.sort(key=lambda t: (t[1] is None, PARTS.index(t[5])))
    rows: list[dict[str, Any]] = []
    with multiprocessing.Pool(args.workers) as pool:
        for row in pool.imap_unordered(run_one, tasks, chunksize=1):
            rows.append(row)
            print(
                f"done: {row['scenario']} ({row['part']}) {row['policy']}: "
                f"avg JCT {row['avg_jct'] / 3600:.2f} h "
                f"in {row['seconds']:.0f} s ({row['cpu_seconds']:.0f} s CPU)",
                flush=True,
            )
            if args.json:
                report["rows"] = rows
                Path(args.json).write_text(json.dumps(report, indent=2))
    for scenario, _, gpus in scenarios:
        for part in parts:
            mine = sorted(
                (r for r in rows if r["scenario"] == scenario and r["part"] == part),
                key=lambda r: POLICIES.index(r["name"]),
            )
            if not mine:
                continue
            report["scenarios"][f"{scenario} ({part})"] = mine
            print(f"\n### {scenario} on {gpus} GPUs, {part} half ({mine[0]['jobs']} jobs)\n")
            print(markdown(mine))
            print("\n" + targets(mine))
    print(f"\nTrace: {PHILLY_ATTRIBUTION}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
