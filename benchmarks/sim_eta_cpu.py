"""CPU seconds of one replay with start estimates (``dlsched sim --eta``), one policy.

    python benchmarks/sim_eta_cpu.py --cluster b436b2 --gpus 96 \
        --end "2017-10-20 08:59:55" --policy priority [--cpu-limit 200] [--estimates out.json]

Run one policy per process: the CPU time is ``getrusage`` (user + sys) of
``simulate(..., estimates=True)`` alone, trace loading left out. With
``--cpu-limit`` the replay is stopped after that many CPU seconds and the
forecasts made by then are printed (one per arrival), with the queue's depth at
the last. ``--estimates`` writes every estimate (job id: expected, P80) and
each job's finish, to compare two versions of the code one by one.

Trace: Microsoft Philly traces (Jeon et al., USENIX ATC'19), CC BY 4.0.
"""

from __future__ import annotations

import argparse
import json
import resource
import signal
from pathlib import Path
from typing import Any

from jupyter_dlsched.sim import engine as sim_engine
from jupyter_dlsched.sim import load_trace, simulate

DEFAULT_TRACE = "philly.csv"


class _OutOfTime(Exception):
    pass


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=DEFAULT_TRACE)
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--end", default=None)
    parser.add_argument("--policy", required=True)
    parser.add_argument("--cpu-limit", type=float, default=None)
    parser.add_argument("--estimates", default=None)
    args = parser.parse_args()
    jobs = load_trace(args.trace, cluster=[args.cluster], end=args.end, max_gpus=args.gpus)
    made: dict[str, Any] = {"forecasts": 0, "depth": 0}
    plain = sim_engine.StartCalibration

    class Counted(plain):  # type: ignore[misc, valid-type]
        def submitted(self, new: Any, queued: Any, *rest: Any) -> None:
            made["forecasts"] += 1
            made["depth"] = len(queued)
            super().submitted(new, queued, *rest)

    sim_engine.StartCalibration = Counted  # type: ignore[misc]

    def stop(*_: Any) -> None:
        raise _OutOfTime

    if args.cpu_limit:
        signal.signal(signal.SIGPROF, stop)
        signal.setitimer(signal.ITIMER_PROF, args.cpu_limit)
    began = _cpu()
    out: dict[str, Any] = {"slice": f"{args.cluster}/{args.gpus}", "policy": args.policy}
    out["jobs"] = len(jobs)
    try:
        result = simulate(jobs, args.policy, args.gpus, estimates=True)
    except _OutOfTime:
        out.update(done=False, cpu_s=round(_cpu() - began, 1), **made)
        print(json.dumps(out))
        return
    signal.setitimer(signal.ITIMER_PROF, 0)
    out.update(done=True, cpu_s=round(_cpu() - began, 1), **made)
    eta = result.eta
    assert eta is not None
    out.update(
        hit=eta.hit,
        median_error_h=eta.median_error / 3600,
        sharpness=eta.sharpness,
        uncertain=eta.uncertain,
        given_hit=eta.given_hit,
        given_sharpness=eta.given_sharpness,
        estimated=eta.jobs,
    )
    print(json.dumps(out))
    if args.estimates:
        Path(args.estimates).write_text(
            json.dumps(
                {
                    "estimates": {k: [e.expected, e.p80] for k, e in eta.estimates.items()},
                    "finish": [j.finish for j in result.jobs],
                }
            )
        )


if __name__ == "__main__":
    main()
