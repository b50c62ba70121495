"""Every built-in policy replayed on the Philly trace, with fifo and oracle srtf as brackets.

    python benchmarks/sim_policies.py [--trace PATH] [--workers 2] [--json out.json]

Scenarios: virtual cluster ed69ec on 8 GPUs, virtual cluster 103959 on 24 GPUs,
the whole trace on 512 GPUs. Jobs declare their true duration as time limit
(what sjf and priority's backfill read); preemption costs a 30 s restart.
gittins is built from the scenario's job-size distribution (sizes known as a
distribution, never per job). Also measures the speed of the simulator: the
whole trace under fifo, fifo-ff and sjf, one after another in one process.

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
from jupyter_dlsched.sim import PHILLY_ATTRIBUTION, load_philly, simulate, summarize

POLICIES = ["fifo", "fifo-ff", "priority", "sjf", "fair", "las", "gittins", "srtf"]
SCENARIOS = [("ed69ec", "ed69ec", 8), ("103959", "103959", 24), ("whole trace", None, 512)]
SPEED_POLICIES = ["fifo", "fifo-ff", "sjf"]
# gittins with its starvation guard at 4 days: the p99 side of the trade-off (small clusters)
GUARDED = "gittins+guard"
DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared/traces/philly.csv"


def run_one(task: tuple[str, str | None, int, str, str]) -> dict[str, Any]:
    scenario, cluster, gpus, policy_name, trace = task
    jobs = load_philly(trace, cluster=cluster, max_gpus=gpus)
    if policy_name == "gittins":
        policy = GittinsPolicy(sizes=[j.gpu_time for j in jobs])
    elif policy_name == GUARDED:
        sizes = [j.gpu_time for j in jobs]
        policy = GittinsPolicy(sizes=sizes, promote_after=4 * 86400, name=GUARDED)
    else:
        policy = get_policy(policy_name)
    began, began_cpu = time.perf_counter(), time.process_time()
    result = simulate(jobs, policy, gpus)
    row = summarize(result)
    row.update(
        scenario=scenario,
        gpus=gpus,
        seconds=time.perf_counter() - began,
        cpu_seconds=time.process_time() - began_cpu,
    )
    return row


def speed(trace: str) -> tuple[dict[str, float], dict[str, float]]:
    """Wall-clock and CPU seconds of whole-trace replays, one after another."""
    jobs = load_philly(trace, max_gpus=512)
    wall, cpu = {}, {}
    for name in SPEED_POLICIES:
        began, began_cpu = time.perf_counter(), time.process_time()
        simulate(jobs, name, 512)
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
    by = {r["policy"]: r for r in rows}
    gittins, srtf, fifo = by["gittins"], by["srtf"], by["fifo"]
    guarded = by.get(GUARDED)
    priority, first_fit = by["priority"], by["fifo-ff"]
    ratio = gittins["avg_jct"] / srtf["avg_jct"]
    return (
        f"gittins avg JCT / srtf avg JCT = {ratio:.2f} (target <= 1.15: "
        f"{'met' if ratio <= 1.15 else 'missed'}); "
        f"gittins p99 {gittins['p99_jct'] / 3600:.1f} h vs fifo {fifo['p99_jct'] / 3600:.1f} h "
        f"({'met' if gittins['p99_jct'] <= fifo['p99_jct'] else 'missed'}); "
        f"priority avg JCT {priority['avg_jct'] / 3600:.2f} h vs fifo-ff "
        f"{first_fit['avg_jct'] / 3600:.2f} h "
        f"({'met' if priority['avg_jct'] <= first_fit['avg_jct'] * (1 + 1e-9) else 'missed'})"
        + (
            f"; {GUARDED}: avg/srtf {guarded['avg_jct'] / srtf['avg_jct']:.2f}, "
            f"p99 {guarded['p99_jct'] / 3600:.1f} h"
            if guarded
            else ""
        )
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
    args = parser.parse_args()

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
            + f"; total {sum(took.values()):.1f} ({sum(cpu.values()):.1f}); "
            + f"1-minute load average before: {load:.1f}",
            flush=True,
        )
    if args.speed_only:
        return
    scenarios = [s for s in SCENARIOS if not args.scenario or s[0] in args.scenario]
    tasks = [
        (scenario, cluster, gpus, policy, args.trace)
        for scenario, cluster, gpus in scenarios
        for policy in POLICIES + ([GUARDED] if cluster else [])
    ]
    # small scenarios first, then the quick whole-trace replays: a cut-short run still says much
    tasks.sort(key=lambda t: (t[1] is None, t[3] not in SPEED_POLICIES))
    rows: list[dict[str, Any]] = []
    with multiprocessing.Pool(args.workers) as pool:
        for row in pool.imap_unordered(run_one, tasks, chunksize=1):
            rows.append(row)
            print(
                f"done: {row['scenario']} {row['policy']}: avg JCT {row['avg_jct'] / 3600:.2f} h "
                f"in {row['seconds']:.0f} s ({row['cpu_seconds']:.0f} s CPU)",
                flush=True,
            )
            if args.json:
                report["rows"] = rows
                Path(args.json).write_text(json.dumps(report, indent=2))
    order = POLICIES + [GUARDED]
    for scenario, _, gpus in scenarios:
        mine = sorted(
            (r for r in rows if r["scenario"] == scenario), key=lambda r: order.index(r["policy"])
        )
        report["scenarios"][scenario] = mine
        print(f"\n### {scenario} on {gpus} GPUs ({mine[0]['jobs']} jobs)\n")
        print(markdown(mine))
        print("\n" + targets(mine))
    print(f"\nTrace: {PHILLY_ATTRIBUTION}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
