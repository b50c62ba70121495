"""``dlsched``: the queue from a shell.

    dlsched status
    dlsched queue [--all] [--mine | -u USER] [--state S[,S]] [--name 'sweep-*']
    dlsched submit --gpus 1 --priority high [--wait] -- python train.py --lr 3e-4
    dlsched cancel JOB_ID [JOB_ID ...] | cancel --name 'sweep-*' [-u USER] [--state queued]
    dlsched logs [-f] JOB_ID
    dlsched history [--since 30d] [--mine | -u USER]
    dlsched priority JOB_ID high
    dlsched sim TRACE --gpus 8 --policy fifo,priority

Every command takes ``--json`` for machine-readable output. A failure is one
line on stderr, ``dlsched <command>: what was wrong and what to do``, with the
exit status listed in ``EXIT_STATUSES`` (``--debug`` adds the traceback).
"""

from __future__ import annotations

import argparse
import errno
import fnmatch
import json
import os
import sqlite3
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .errors import DlschedError, LedgerUnavailable
from .history import history_table, period_words, totals_by_owner
from .options import add_resource_flags, flag_resources
from .scheduler import Scheduler
from .schema import ACTIVE, STATES, JobInfo
from .store import default_home
from .units import parse_duration
from .words import owner_words, priority_words, state_words

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_CLOSED_PIPE = 141  # what a shell reports for a program stopped by SIGPIPE

EXIT_STATUSES = """\
exit status:
  0    done
  1    the job failed (submit --wait), cancel found no unfinished job to cancel,
       the job ledger could not be read or written, or an unexpected error
  2    bad usage or input: an unknown option or value, an unknown job id,
       a state folder you cannot use
  N    submit --wait of a command: the command's own exit status
  130  interrupted (Ctrl-C)
  141  stdout was closed early (dlsched queue --all | head)

A failure prints one line on stderr, `dlsched COMMAND: what was wrong`;
`dlsched --debug COMMAND ...` adds the traceback."""


class CommandError(DlschedError):
    """A command cannot do what was asked; ``status`` is the exit status to end with."""

    def __init__(self, message: str, status: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.status = status


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the command, not the usage block."""

    # the sub-command parsers by name, so an unknown option is reported by its command
    commands: Mapping[str, argparse.ArgumentParser]

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: {message}; see `{self.prog} --help`\n")

    def parse_command_line(self, argv: list[str] | None) -> argparse.Namespace:
        argv = sys.argv[1:] if argv is None else argv
        args, unknown = self.parse_known_args(argv)
        if unknown:
            name = getattr(args, "command_name", "")
            # an unknown option before the command name is dlsched's, after it the command's
            before = argv[: argv.index(name)] if name in argv else argv
            owner = self if unknown[0] in before else self.commands.get(name, self)
            owner.error(f"unrecognized arguments: {' '.join(unknown)}")
        return args


def _scheduler(args: argparse.Namespace) -> Scheduler:
    return Scheduler(home=args.home, loop=False, probe_pool=False)


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


# -- argument types: a bad value becomes a one-line usage error, never an OverflowError ------


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number such as 3, got {text!r}"
        ) from None


def _duration(text: str) -> float:
    try:
        return parse_duration(text.strip(), "--since")
    except DlschedError:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 12h or 30d, got {text!r}"
        ) from None


def _state_list(allowed: Iterable[str]) -> Callable[[str], list[str]]:
    choices = tuple(allowed)

    def parse(text: str) -> list[str]:
        states = [s.strip().lower() for s in text.split(",") if s.strip()]
        unknown = [s for s in states if s not in choices]
        if unknown or not states:
            raise argparse.ArgumentTypeError(
                f"unknown state {(unknown or [text])[0]!r}; choose from {', '.join(choices)}"
            )
        return states

    return parse


def _flatten(groups: list[list[str]] | None) -> list[str] | None:
    return list(dict.fromkeys(s for group in groups for s in group)) if groups else None


def _name_matches(pattern: str | None, name: str) -> bool:
    """``--name`` is an exact name, or a glob when it has ``*``, ``?`` or ``[``."""
    if pattern is None:
        return True
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatchcase(name, pattern)
    return name == pattern


def _selection(args: argparse.Namespace) -> str:
    """The filters in words, for a message about what they matched."""
    parts = [f"--name {args.name!r}"] if args.name else []
    if args.user:
        parts.append(f"-u {args.user}")
    if args.state:
        parts.append(f"--state {','.join(_flatten(args.state) or [])}")
    return " ".join(parts)


# -- commands --------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    with _scheduler(args) as s:
        s.tick()
        status = s.status()
        pool = s.pool()
    if args.json:
        _print_json({**status, "pool": pool.to_json()})
        return EXIT_OK
    counts = status["counts"]
    gpus = status["gpus"]
    sim = f" ({gpus['simulated']} simulated)" if gpus["simulated"] else ""
    print(
        f"GPU {gpus['busy']}/{gpus['total']}{sim} busy · {counts['running']} running · "
        f"{counts['queued'] + counts['preempted']} queued · policy {status['policy']}"
    )
    print(repr(pool))
    return EXIT_OK


def _queue_order(jobs: list[JobInfo]) -> list[JobInfo]:
    """Running (newest first), then waiting in line order, then finished newest first."""
    running = sorted((j for j in jobs if j.state == "running"), key=lambda j: -j.seq)
    waiting = sorted(
        (j for j in jobs if j.state in ("queued", "preempted")),
        key=lambda j: (j.position or 10**9, j.seq),
    )
    finished = sorted((j for j in jobs if j.state not in ACTIVE), key=lambda j: -j.seq)
    return [*running, *waiting, *finished]


def cmd_queue(args: argparse.Namespace) -> int:
    states = _flatten(args.state)
    with _scheduler(args) as s:
        s.tick()
        owner = s.owner if args.mine else args.user
        wanted = states or (None if args.all else list(ACTIVE))
        jobs = [j for j in s.jobs(state=wanted, owner=owner) if _name_matches(args.name, j.name)]
    jobs = _queue_order(jobs)
    if args.json:
        _print_json([j.to_json() for j in jobs])
        return EXIT_OK
    if not jobs:
        if states or owner or args.name:
            print("no jobs match" + ("" if args.all or states else " (--all includes finished)"))
        else:
            print("no jobs" if args.all else "no queued or running jobs (--all shows finished)")
        return EXIT_OK
    rows = [("ID", "NAME", "OWNER", "PRIORITY", "REQUEST", "DEVICES", "STATE")]
    for j in jobs:
        devices = ",".join(map(str, j.devices)) or "-"
        rows.append(
            (
                j.id,
                j.name[:24],
                owner_words(j),
                priority_words(j.priority),
                j.request.describe(),
                devices,
                state_words(j),
            )
        )
    _print_table(rows)
    return EXIT_OK


def _print_table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])


def cmd_history(args: argparse.Namespace) -> int:
    since = time.time() - args.since
    with _scheduler(args) as s:
        owner = s.owner if args.mine else args.user
        jobs = [
            j
            for j in s.store.finished_jobs(since=since, owner=owner)
            if _name_matches(args.name, j.name)
        ]
    totals = totals_by_owner(jobs)
    shown = jobs[: args.limit]
    if args.json:
        _print_json(
            {
                "since": since,
                "jobs": [j.to_json() for j in shown],
                "totals": [t.to_json() for t in totals],
            }
        )
        return EXIT_OK
    period = period_words(args.since)
    if not jobs:
        print(f"no jobs finished in the last {period}")
        return EXIT_OK
    _print_table(history_table(shown))
    if len(shown) < len(jobs):
        print(f"... {len(jobs) - len(shown)} more (-n/--limit shows more)")
    print(f"\nin the last {period}:")
    for total in totals:
        print("  " + total.words())
    return EXIT_OK


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
    if not argv:
        raise CommandError("give the command after --, e.g. dlsched submit -- python x.py")
    resources = flag_resources(args)
    with _scheduler(args) as s:
        job_id = s.submit_command(argv, **resources).id
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


def cmd_logs(args: argparse.Namespace) -> int:
    chunks: list[bytes] = []
    with _scheduler(args) as s:
        info = _follow(s, args.job_id, chunks.append if args.json else _write_stdout, args.follow)
    if args.json:
        _print_json({"id": info.id, "log": b"".join(chunks).decode(errors="replace")})
    return EXIT_OK


# -- the parser ------------------------------------------------------------------------------


def build_parser() -> _Parser:
    parser = _Parser(
        prog="dlsched",
        description="The jupyter-dlsched job queue from a shell.",
        epilog=EXIT_STATUSES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--home", help="state folder (default: $DLSCHED_HOME or Jupyter's)")
    parser.add_argument("--debug", action="store_true", help="show the traceback of a failure")
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND", required=True)

    def add(name: str, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", action="store_true", help="machine-readable output")
        return p

    add("status", "pool and queue summary").set_defaults(run=cmd_status)

    q = add("queue", "running and queued jobs, and why each one waits")
    q.add_argument("--all", action="store_true", help="include finished jobs (newest first)")
    who = q.add_mutually_exclusive_group()
    who.add_argument("--mine", action="store_true", help="only my jobs")
    who.add_argument("-u", "--user", help="only this user's jobs")
    q.add_argument(
        "--state",
        action="append",
        type=_state_list(STATES),
        help=f"only jobs in these states (repeat or comma-separate): {', '.join(STATES)}",
    )
    q.add_argument("--name", help="only jobs with this name (a glob such as 'sweep-*' works)")
    q.set_defaults(run=cmd_queue)

    s = add("submit", "run a command as a job: dlsched submit --gpus 1 -- python train.py")
    add_resource_flags(s)  # the same set as dls.submit's keywords and %%schedule's flags
    s.add_argument(
        "--wait",
        action="store_true",
        help="print the job's output as it runs and exit with its exit status",
    )
    s.add_argument("command", nargs=argparse.REMAINDER)
    s.set_defaults(run=cmd_submit)

    c = add("cancel", "cancel jobs by id, or every unfinished job matching filters")
    c.add_argument("job_ids", nargs="*", metavar="ID")
    c.add_argument("--name", help="jobs with this name (a glob such as 'sweep-*' works)")
    c.add_argument("-u", "--user", help="jobs of this user")
    c.add_argument(
        "--state",
        action="append",
        type=_state_list(ACTIVE),
        help=f"jobs in these states: {', '.join(ACTIVE)}",
    )
    c.set_defaults(run=cmd_cancel)

    p = add("priority", "change a job's priority")
    p.add_argument("job_id", metavar="ID")
    p.add_argument("priority", help="an integer or low, normal, high, urgent")
    p.set_defaults(run=cmd_priority)

    h = add("history", "finished jobs and what they used: GPU-hours, CPU time, peak memory")
    h.add_argument(
        "--since",
        type=_duration,
        default=7 * 86400.0,
        help="how far back, e.g. 12h, 30d (default 7d)",
    )
    who = h.add_mutually_exclusive_group()
    who.add_argument("--mine", action="store_true", help="only my jobs")
    who.add_argument("-u", "--user", help="only this user's jobs")
    h.add_argument("--name", help="only jobs with this name (a glob such as 'sweep-*' works)")
    h.add_argument(
        "-n", "--limit", type=_whole_number, default=50, help="rows to show (default 50)"
    )
    h.set_defaults(run=cmd_history)

    lg = add("logs", "print a job's output")
    lg.add_argument("-f", "--follow", action="store_true", help="keep printing until it ends")
    lg.add_argument("job_id", metavar="ID")
    lg.set_defaults(run=cmd_logs)

    try:
        from .sim.cli import add_parser as add_sim
    except ImportError:
        pass
    else:
        add_sim(sub)
    parser.commands = sub.choices
    return parser


# -- failures as one line --------------------------------------------------------------------


def _home(args: argparse.Namespace) -> Path | None:
    try:
        return Path(args.home).expanduser() if args.home else default_home()
    except Exception:
        return None


def _within(a: Path, b: Path) -> bool:
    a, b = a.absolute(), b.absolute()
    return a == b or b in a.parents or a in b.parents


def _explain(error: BaseException, args: argparse.Namespace) -> tuple[int, str]:
    """The exit status and the one line a failure prints."""
    home = _home(args)
    if isinstance(error, CommandError):
        return error.status, str(error)
    if isinstance(error, LedgerUnavailable):
        return EXIT_FAILED, str(error)
    if isinstance(error, DlschedError):
        return EXIT_USAGE, str(error)
    if isinstance(error, OverflowError):
        return EXIT_USAGE, f"a number is too large ({error}); give a smaller one"
    if isinstance(error, sqlite3.Error):
        return EXIT_FAILED, (
            f"could not read or write the job ledger in {home}: {error}; check that the disk "
            "has room and the folder is yours, or pass --home DIR"
        )
    if isinstance(error, OSError):
        what = f"{error.strerror}: {error.filename}" if error.filename else str(error)
        if isinstance(error, FileExistsError | NotADirectoryError):
            what = f"{error.filename} is not a folder"
        if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
            return EXIT_FAILED, f"{what}; free some space and try again"
        if home is not None and error.filename and _within(Path(os.fsdecode(error.filename)), home):
            return EXIT_USAGE, (
                f"cannot use the state folder {home} ({what}); use a folder you own: "
                "--home DIR or DLSCHED_HOME=DIR"
            )
        return EXIT_USAGE, what
    if isinstance(error, ValueError):
        return EXIT_USAGE, str(error)
    return EXIT_FAILED, (
        f"unexpected {type(error).__name__}: {error}; `dlsched --debug ...` shows where "
        "(please report it)"
    )


def _stdout_closed() -> int:
    # later writes (and the flush at exit) go nowhere instead of raising "Exception ignored"
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_CLOSED_PIPE


def main(argv: list[str] | None = None) -> int:
    """Run ``dlsched``; returns the exit status (see ``EXIT_STATUSES``)."""
    args = build_parser().parse_command_line(argv)
    command = f"dlsched {args.command_name}"
    try:
        status = int(args.run(args))
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        return _stdout_closed()
    except KeyboardInterrupt:
        if args.debug:
            traceback.print_exc()
        print(f"{command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:
        if args.debug:
            traceback.print_exc()
        status, message = _explain(error, args)
        print(f"{command}: {message}", file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())
