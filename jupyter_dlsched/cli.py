"""``dlsched``: the queue from a shell.

    dlsched status
    dlsched queue [--all]
    dlsched submit --gpus 1 --priority high -- python train.py --lr 3e-4
    dlsched cancel JOB_ID
    dlsched logs [-f] JOB_ID
    dlsched priority JOB_ID high
    dlsched sim TRACE --gpus 8 --policy fifo,priority

Every command takes ``--json`` for machine-readable output.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from .errors import DlschedError
from .scheduler import Scheduler
from .store import ACTIVE
from .words import state_words


def _scheduler(args: argparse.Namespace) -> Scheduler:
    return Scheduler(home=args.home, loop=False, probe_pool=False)


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def cmd_status(args: argparse.Namespace) -> int:
    with _scheduler(args) as s:
        s.tick()
        status = s.status()
        pool = s.pool()
    if args.json:
        _print_json({**status, "pool": pool.to_json()})
        return 0
    counts = status["counts"]
    gpus = status["gpus"]
    sim = f" ({gpus['simulated']} simulated)" if gpus["simulated"] else ""
    print(
        f"GPU {gpus['busy']}/{gpus['total']}{sim} busy · {counts['running']} running · "
        f"{counts['queued'] + counts['preempted']} queued · policy {status['policy']}"
    )
    print(repr(pool))
    return 0


def cmd_queue(args: argparse.Namespace) -> int:
    with _scheduler(args) as s:
        s.tick()
        jobs = s.jobs() if args.all else s.jobs(state=ACTIVE)
    if args.json:
        _print_json([j.to_json() for j in jobs])
        return 0
    if not jobs:
        print("no jobs" if args.all else "no queued or running jobs (--all shows finished ones)")
        return 0
    running = sorted((j for j in jobs if j.state == "running"), key=lambda j: -j.seq)
    waiting = sorted(
        (j for j in jobs if j.state in ("queued", "preempted")),
        key=lambda j: (j.position or 10**9, j.seq),
    )
    finished = [j for j in jobs if j.state not in ACTIVE]
    rows = [("ID", "NAME", "OWNER", "PRI", "REQUEST", "DEVICES", "STATE")]
    for j in [*running, *waiting, *finished]:
        devices = ",".join(map(str, j.devices)) or "-"
        rows.append(
            (
                j.id,
                j.name[:24],
                j.owner,
                str(j.priority),
                j.request.describe(),
                devices,
                state_words(j),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    argv = list(args.command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print(
            "dlsched submit: give the command after --, e.g. dlsched submit -- python x.py",
            file=sys.stderr,
        )
        return 2
    resources = {
        k: v
        for k, v in {
            "gpus": args.gpus,
            "gpu_mem": args.gpu_mem,
            "cpus": args.cpus,
            "mem": args.mem,
            "priority": args.priority,
            "name": args.name,
            "time_limit": args.time_limit,
            "retries": args.retries,
            "after": args.after.split(",") if args.after else None,
            "preemptible": args.preemptible or None,
        }.items()
        if v is not None
    }
    with _scheduler(args) as s:
        handle = s.submit_command(argv, **resources)
        info = s.info(handle.id)
        if args.wait:
            info = handle.wait()
    if args.json:
        _print_json(info.to_json())
    else:
        print(info.id if not args.wait else f"{info.id} {state_words(info)}")
    return 0 if not args.wait or info.state == "succeeded" else 1


def cmd_cancel(args: argparse.Namespace) -> int:
    with _scheduler(args) as s:
        info = s.cancel(args.job_id)
    if args.json:
        _print_json(info.to_json())
    else:
        what = "cancel requested" if info.state == "running" else info.state
        print(f"{info.id} {what}")
    return 0


def cmd_priority(args: argparse.Namespace) -> int:
    with _scheduler(args) as s:
        info = s.set_priority(args.job_id, args.priority)
    if args.json:
        _print_json(info.to_json())
    else:
        print(f"{info.id} priority {info.priority}")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    with _scheduler(args) as s:
        s.info(args.job_id)
        path = s.log_path(args.job_id)
        offset = 0
        chunks = []
        while True:
            if path.exists():
                with open(path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
                offset += len(data)
                if args.json:
                    chunks.append(data.decode(errors="replace"))
                else:
                    sys.stdout.write(data.decode(errors="replace"))
                    sys.stdout.flush()
            if not args.follow or s.info(args.job_id).done:
                if args.follow and path.exists() and path.stat().st_size > offset:
                    continue
                break
            s.tick()
            time.sleep(0.2)
    if args.json:
        _print_json({"id": args.job_id, "log": "".join(chunks)})
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dlsched", description="The jupyter-dlsched job queue from a shell."
    )
    parser.add_argument("--home", help="state folder (default: $DLSCHED_HOME or Jupyter's)")
    sub = parser.add_subparsers(dest="command_name", required=True)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        return p

    add("status", "pool and queue summary").set_defaults(run=cmd_status)
    q = add("queue", "running and queued jobs")
    q.add_argument("--all", action="store_true", help="include finished jobs")
    q.set_defaults(run=cmd_queue)
    s = add("submit", "run a command as a job: dlsched submit --gpus 1 -- python train.py")
    s.add_argument("--gpus", type=float)
    s.add_argument("--gpu-mem")
    s.add_argument("--cpus", type=float)
    s.add_argument("--mem")
    s.add_argument("--priority")
    s.add_argument("--name")
    s.add_argument("--time-limit")
    s.add_argument("--retries", type=int)
    s.add_argument("--after", help="comma-separated job ids that must succeed first")
    s.add_argument("--preemptible", action="store_true")
    s.add_argument("--wait", action="store_true", help="wait for the job to finish")
    s.add_argument("command", nargs=argparse.REMAINDER)
    s.set_defaults(run=cmd_submit)
    c = add("cancel", "cancel a job")
    c.add_argument("job_id")
    c.set_defaults(run=cmd_cancel)
    p = add("priority", "change a job's priority")
    p.add_argument("job_id")
    p.add_argument("priority")
    p.set_defaults(run=cmd_priority)
    lg = add("logs", "print a job's output")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing until it ends")
    lg.add_argument("job_id")
    lg.set_defaults(run=cmd_logs)
    try:
        from .sim.cli import add_parser as add_sim
    except ImportError:
        pass
    else:
        add_sim(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command_name == "submit" and args.gpus is not None and args.gpus.is_integer():
        args.gpus = int(args.gpus)
    try:
        return int(args.run(args))
    except DlschedError as error:
        print(f"dlsched {args.command_name}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
