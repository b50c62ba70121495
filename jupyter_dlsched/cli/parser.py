"""The ``dlsched`` argument parser: every command, its flags, and one-line usage errors."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import NoReturn

from .._version import __version__
from ..vocab.errors import DlschedError
from ..vocab.options import add_resource_flags
from ..vocab.schema import ACTIVE, STATES
from ..vocab.units import parse_duration
from .common import EXIT_STATUSES, EXIT_USAGE
from .jobs import cmd_cancel, cmd_logs, cmd_priority, cmd_requeue, cmd_submit
from .notebook import add_notebook_flags
from .reports import cmd_history, cmd_queue, cmd_status


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
    parser.add_argument("--version", action="version", version=f"dlsched {__version__}")
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

    s = add(
        "submit",
        "run a command as a job: dlsched submit --gpus 1 -- python train.py; "
        "or a notebook: dlsched submit --gpus 1 --notebook train.ipynb -p lr=3e-4",
    )
    add_resource_flags(s)  # the same set as dls.submit's keywords and %%schedule's flags
    s.add_argument(
        "--wait",
        action="store_true",
        help="print the job's output as it runs and exit with its exit status",
    )
    add_notebook_flags(s)
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

    r = add("requeue", "run finished jobs again: a new job each, same spec, linked to the old")
    r.add_argument("job_ids", nargs="+", metavar="ID")
    r.set_defaults(run=cmd_requeue)

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

    from .schedules import add_parser as add_schedules
    from .service import add_parser as add_service

    add_schedules(sub)

    add_service(sub)
    from .kernels import add_parser as add_kernels

    add_kernels(sub)
    try:
        from ..sim.cli import add_parser as add_sim
    except ImportError:
        pass
    else:
        add_sim(sub)
    parser.commands = sub.choices
    return parser
