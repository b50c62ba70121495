"""Commands that act on jobs: ``dlsched submit``, ``cancel``, ``priority``, ``requeue`` and
``logs``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from ..client.scheduler import Scheduler
from ..vocab.options import flag_resources
from ..vocab.schema import ACTIVE, JobInfo
from ..vocab.words import state_words
from .common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    CommandError,
    _flatten,
    _name_matches,
    _print_json,
    _scheduler,
    _selection,
)
from .notebook import notebook_request


def _follow(s: Scheduler, job_id: str, write: Callable[[bytes], None], follow: bool) -> JobInfo:
    """Copy the job's log to ``write`` (until the job ends when ``follow``); its final row."""
    path = s.log_path(job_id)
    offset = 0
    while True:
        # the state is read before the log: once it says the job ended, the log is complete
        info = s.info(job_id)
        if path.exists():
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            if data:
                offset += len(data)
                write(data)
        if not follow or info.done:
            return info
        s.tick()
        time.sleep(0.2)


def _write_stdout(data: bytes) -> None:
    # bytes as the job wrote them: a character split between two reads stays whole
    sys.stdout.flush()
    binary = getattr(sys.stdout, "buffer", None)
    if binary is None:  # a text-only stream stands in for stdout
        sys.stdout.write(data.decode(errors="replace"))
        return
    binary.write(data)
    binary.flush()


def _job_exit_status(info: JobInfo) -> int:
    """0 for success, a command's own exit status when it has one, else 1."""
    if info.state == "succeeded":
        return EXIT_OK
    code = info.exit_code
    if info.kind == "command" and info.state == "failed" and code is not None and 0 < code < 256:
        return code
    return EXIT_FAILED


def cmd_submit(args: argparse.Namespace) -> int:
    argv = list(args.command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    notebook = notebook_request(args, argv)
    if not argv and notebook is None:
        raise CommandError("give the command after --, e.g. dlsched submit -- python x.py")
    resources = flag_resources(args)
    if notebook is not None:
        from ..nbjobs.submit import check_resources

        check_resources(resources)  # refused here, before a pool agent is started
    with _scheduler(args) as s:
        if notebook is not None:
            job_id = s.submit_notebook(**notebook, **resources).id
        else:
            job_id = s.submit_command(argv, **resources).id
        if resources.get("every") is not None:
            print(schedule_words(s, job_id), file=sys.stderr)
        if not args.wait:
            info = s.info(job_id)
            if args.json:
                _print_json(info.to_json())
            else:
                print(info.id)
            return EXIT_OK
        chunks: list[bytes] = []
        try:
            info = _follow(s, job_id, chunks.append if args.json else _write_stdout, follow=True)
        except KeyboardInterrupt:
            raise CommandError(
                f"interrupted; job {job_id} goes on (`dlsched cancel {job_id}` stops it)",
                EXIT_INTERRUPTED,
            ) from None
    if args.json:
        _print_json({**info.to_json(), "log": b"".join(chunks).decode(errors="replace")})
    # stdout carries only the job's output; how it ended goes to stderr
    print(f"dlsched submit: job {info.id} {state_words(info)}", file=sys.stderr)
    return _job_exit_status(info)


def schedule_words(s: Scheduler, job_id: str) -> str:
    """What ``--every`` made: ``"schedule s4k2m9qa: a new run every 3s (dlsched schedules)"``."""
    made = [x for x in s.schedules() if x.template == job_id]
    if not made:
        return f"dlsched submit: job {job_id} has no schedule"
    return f"schedule {made[0].id}: a new run every {made[0].every} (dlsched schedules)"


def cmd_cancel(args: argparse.Namespace) -> int:
    states = _flatten(args.state)
    if not args.job_ids and not (args.name or args.user or states):
        raise CommandError(
            "say which jobs: give job ids, or filters --name NAME, -u USER, --state STATE "
            "(dlsched cancel --name 'sweep-*')"
        )
    with _scheduler(args) as s:
        if args.job_ids:
            # every id is checked before any job is touched: a typo cancels nothing
            jobs = [s.info(job_id) for job_id in dict.fromkeys(args.job_ids)]
        else:
            jobs = s.jobs(state=states or list(ACTIVE))
        jobs = [
            j
            for j in jobs
            if _name_matches(args.name, j.name)
            and (args.user is None or j.owner == args.user)
            and (states is None or j.state in states)
        ]
        if not jobs:
            raise CommandError(
                f"no unfinished job matches {_selection(args)}; `dlsched queue --all` lists jobs",
                EXIT_FAILED,
            )
        cancelled: list[JobInfo] = []
        lines: list[str] = []
        for job in jobs:
            info = job if job.done else s.cancel(job.id)
            if job.done or (info.done and info.state != "cancelled"):
                lines.append(f"{info.id} already {info.state}")
                continue
            cancelled.append(info)
            lines.append(f"{info.id} {'cancel requested' if not info.done else 'cancelled'}")
    if not cancelled:
        # every job named had already ended: nothing was cancelled, and the status says so
        raise CommandError(f"nothing to cancel: {', '.join(lines)}", EXIT_FAILED)
    if args.json:
        _print_json([j.to_json() for j in cancelled])
    else:
        print("\n".join(lines))
    return EXIT_OK


def cmd_priority(args: argparse.Namespace) -> int:
    with _scheduler(args) as s:
        info = s.set_priority(args.job_id, args.priority)
    if args.json:
        _print_json(info.to_json())
    else:
        print(f"{info.id} priority {info.priority}")
    return EXIT_OK


def cmd_requeue(args: argparse.Namespace) -> int:
    with _scheduler(args) as s:
        # every id is checked before any job is requeued: one unfinished job requeues nothing
        jobs = [s.info(job_id) for job_id in dict.fromkeys(args.job_ids)]
        unfinished = [j for j in jobs if not j.done]
        if unfinished:
            listed = ", ".join(f"{j.id} is {j.state}" for j in unfinished)
            raise CommandError(
                f"only finished jobs can be requeued ({listed}); nothing was requeued",
                EXIT_FAILED,
            )
        new = [s.requeue_job(j.id) for j in jobs]
    if args.json:
        _print_json([j.to_json() for j in new])
    else:
        print("\n".join(f"{old.id} requeued as {j.id}" for old, j in zip(jobs, new, strict=True)))
    return EXIT_OK


def cmd_logs(args: argparse.Namespace) -> int:
    chunks: list[bytes] = []
    with _scheduler(args) as s:
        info = _follow(s, args.job_id, chunks.append if args.json else _write_stdout, args.follow)
    if args.json:
        _print_json({"id": info.id, "log": b"".join(chunks).decode(errors="replace")})
    return EXIT_OK
