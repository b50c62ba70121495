"""Running ``dlsched``: ``main``, and every failure as one line with its exit status."""

from __future__ import annotations

import argparse
import errno
import os
import sqlite3
import sys
import traceback
from pathlib import Path

from ..vocab.errors import DlschedError, IllegalTransition, JobNotFound, LedgerUnavailable
from ..vocab.private import default_home
from .common import EXIT_CLOSED_PIPE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USAGE, CommandError
from .parser import build_parser


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
    if isinstance(error, JobNotFound):
        # the exception's own hint names dls.jobs() too, which a shell cannot run
        return EXIT_USAGE, f"no job with id {error.job_id!r}; `dlsched queue --all` lists the jobs"
    if isinstance(error, LedgerUnavailable | IllegalTransition):
        # IllegalTransition: the job's state does not allow it (a finished job's priority,
        # requeueing an unfinished job); the input itself was fine
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
