"""The default policy against ``fifo`` on whole Philly virtual clusters, priorities equal.

    python benchmarks/priority_vs_fifo.py [--trace PATH] [--slice CLUSTER/GPUS ...]
        [--json out.json]

Each slice is one virtual cluster of the trace, every job of it, replayed on a
pool of GPUS (jobs wider than the pool dropped), as ``dlsched sim --cluster
CLUSTER --gpus GPUS`` does. Printed per slice: average / p99 JCT in hours under
``fifo``, the default ``priority``, ``priority`` without ``reclaim`` (backfill's
bet, not taken back where it fails), ``priority`` with ``learn_sizes=False``
(backfill only on declared time limits: the trace declares none) and
``fifo-ff``, each marked ``A`` where its average is above ``fifo``'s and ``P``
where its p99 is. The target: the default is never above ``fifo``.

The 35 slices by default: every virtual cluster of a few hundred jobs or more
on the pool sizes its widest jobs allow, the published ones among them.

Trace: Microsoft Philly traces (Jeon et al., USENIX ATC'19), CC BY 4.0;
processed form from the Pollux artifact (petuum/adaptdl, osdi21-artifact).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from sim_policies import DEFAULT_TRACE

from jupyter_dlsched.policy import get_policy
from jupyter_dlsched.policy.priority import PriorityPolicy
from jupyter_dlsched.sim import load_philly, simulate, summarize

SLICES = (
    "e13805/16 e13805/24 e13805/32 e13805/48 2869ce/24 2869ce/32 2869ce/40 2869ce/48 "
    "7f04ca/16 7f04ca/24 7f04ca/32 7f04ca/48 7f04ca/64 0e4a51/16 0e4a51/24 0e4a51/32 "
    "0e4a51/48 0e4a51/64 ee9e8c/32 ee9e8c/48 ee9e8c/64 ed69ec/8 ed69ec/12 ed69ec/16 "
    "103959/16 103959/20 103959/24 103959/32 103959/48 b436b2/32 b436b2/48 b436b2/64 "
    "6c71a0/32 6c71a0/48 6c71a0/64"
).split()
VARIANTS = {
    "fifo": lambda: get_policy("fifo"),
    "priority": lambda: get_policy("priority"),
    "priority, reclaim=False": lambda: PriorityPolicy(reclaim=False),
    "priority, learn_sizes=False": lambda: PriorityPolicy(learn_sizes=False),
    "fifo-ff": lambda: get_policy("fifo-ff"),
}


def replay(trace: str, name: str) -> dict[str, tuple[float, float]]:
    cluster, gpus = name.split("/")
    jobs = list(load_philly(trace, cluster=cluster, max_gpus=int(gpus)))
    out = {}
    for variant, make in VARIANTS.items():
        row = summarize(simulate(jobs, make(), int(gpus)))
        out[variant] = (row["avg_jct"] / 3600, row["p99_jct"] / 3600)
    return out


def marks(row: tuple[float, float], fifo: tuple[float, float]) -> str:
    return ("A" if row[0] > fifo[0] + 1e-9 else "") + ("P" if row[1] > fifo[1] + 1e-9 else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(DEFAULT_TRACE))
    parser.add_argument("--slice", action="append", dest="slices", metavar="CLUSTER/GPUS")
    parser.add_argument("--json", help="also write every figure here")
    args = parser.parse_args()
    slices = args.slices or list(SLICES)
    started = time.process_time()
    print("| slice | " + " | ".join(VARIANTS) + " |")
    print("|---" * (len(VARIANTS) + 1) + "|")
    results: dict[str, Any] = {}
    above: dict[str, list[str]] = {variant: [] for variant in VARIANTS}
    for name in slices:
        row = results[name] = replay(args.trace, name)
        cells = []
        for variant, figures in row.items():
            mark = marks(figures, row["fifo"])
            if mark:
                above[variant].append(f"{name} {mark}")
            cells.append(f"{figures[0]:.2f} / {figures[1]:.1f} {mark}".strip())
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    print()
    for variant in VARIANTS:
        listed = ", ".join(above[variant]) or "none"
        print(f"above fifo, {variant}: {len(above[variant])} of {len(slices)} ({listed})")
    print(f"CPU: {time.process_time() - started:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
